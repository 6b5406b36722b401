"""The cut of a flush's rows into flow and vocoder passes by their costs (flow.py: cheapest_groups)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from convtts.config import ConfigError, load_config
from convtts.speak.cosyvoice.engine.flow import cheapest_groups, length_groups
from convtts.speak.cosyvoice.engine.profiles import DIT, UNET, PassCosts, configured, profile


def priced(fixed: float, per_frame: float):
    return lambda rows, longest: fixed + per_frame * rows * longest


def total(groups, cost) -> float:
    return sum(cost(len(g), max(g)) for g in groups)


def brute_force(lengths: list[int], cost, cap) -> float:
    """The least total cost over every cut of the sorted lengths into consecutive groups."""
    ordered = sorted(lengths)
    best = float("inf")
    for cuts in itertools.product((False, True), repeat=len(ordered) - 1):
        groups, current = [], [ordered[0]]
        for length, cut in zip(ordered[1:], cuts):
            if cut:
                groups.append(current)
                current = []
            current.append(length)
        groups.append(current)
        if all(len(g) <= cap(max(g)) for g in groups):
            best = min(best, total(groups, cost))
    return best


def test_rows_of_any_lengths_share_a_pass_while_a_pass_costs_more_than_their_padding():
    lengths = [40, 55, 90, 130, 200]
    assert cheapest_groups(lengths, int, priced(1000.0, 0.01)) == [lengths]


def test_a_long_row_among_short_ones_gets_its_own_pass():
    """Padding forty rows of 1 s to 30 s would cost far more than a second pass."""
    lengths = [86] * 40 + [2600]
    assert cheapest_groups(lengths, int, priced(700.0, 0.018)) == [[86] * 40, [2600]]


def test_every_length_alone_when_only_padding_costs():
    lengths = [5, 3, 5, 9, 3]
    assert cheapest_groups(lengths, int, priced(0.0, 1.0)) == [[3, 3], [5, 5], [9]]


def test_no_pass_holds_more_rows_than_its_cap():
    lengths = list(range(1, 50))
    groups = cheapest_groups(lengths, int, priced(1e6, 0.0), cap=lambda longest: 8)
    assert [len(g) for g in groups] == [1] + [8] * 6  # seven passes at least; the leftover row first
    assert sorted(x for g in groups for x in g) == lengths


@pytest.mark.parametrize("seed", range(20))
def test_the_cut_is_the_cheapest_one(seed):
    rng = random.Random(seed)
    lengths = [rng.choice((rng.randint(20, 200), rng.randint(500, 2600))) for _ in range(rng.randint(1, 11))]
    cost = priced(rng.choice((0.0, 60.0, 700.0)), rng.choice((0.01, 0.018, 1.0)))
    cap = (lambda longest: 1 << 30) if seed % 2 else (lambda longest: max(1, 4000 // longest))
    groups = cheapest_groups(lengths, int, cost, cap)
    assert sorted(x for g in groups for x in g) == sorted(lengths)
    assert total(groups, cost) == pytest.approx(brute_force(lengths, cost, cap))
    # never dearer than passes of close lengths
    assert total(groups, cost) <= total(length_groups(lengths, int, cap), cost) + 1e-9


def test_pass_costs_in_seconds_replay_below_eager():
    costs = PassCosts(pass_ms=700.0, frame_us=18.0, replay_ms=60.0)
    assert costs.seconds(0) == pytest.approx(0.7)
    assert costs.seconds(1000, replayed=True) == pytest.approx(0.06 + 0.018)
    assert PassCosts(12.0, 7.5).seconds(1000, replayed=True) == pytest.approx(0.012 + 0.0075)
    capturing = PassCosts(pass_ms=700.0, frame_us=18.0, replay_ms=60.0, capture_ms=150.0)
    assert capturing.seconds(1000, captured=True) == pytest.approx(0.15 + 0.018)
    assert costs.seconds(1000, captured=True) == pytest.approx(0.7 + 0.018)  # no capture price: as eager


def test_grouping_is_cost_by_default_and_checked():
    flow = load_config(None, []).tts.cosyvoice.flow
    assert flow.grouping == "cost" and flow.pass_ms is None  # the engine's profile, unless set
    with pytest.raises(ConfigError, match="grouping must be cost or spread"):
        load_config(None, ["tts.cosyvoice.flow.grouping=widest"])
    with pytest.raises(ConfigError, match="pass_ms must be between"):
        load_config(None, ["tts.cosyvoice.flow.pass_ms=-1"])


def test_each_flow_takes_its_gpu_kinds_measured_costs_and_the_config_may_set_them():
    unet = profile("NVIDIA H200", UNET)
    dit = profile("NVIDIA H200", DIT)
    assert unet.flow.pass_ms > 10 * dit.flow.pass_ms  # the U-Net's eager pass is launch-bound, the DiT's not
    assert profile("NVIDIA A100-SXM4-80GB", DIT) is dit  # a kind not measured: the H200's, for its flow
    assert profile("cpu", "SomeOtherEstimator") is unet
    flow, vocoder = configured(dit, load_config(None, ["tts.cosyvoice.flow.frame_us=50"]).tts.cosyvoice.flow)
    assert (flow.pass_ms, flow.frame_us, flow.replay_ms) == (dit.flow.pass_ms, 50.0, dit.flow.replay_ms)
    assert vocoder == dit.vocoder


def test_flush_share_is_checked():
    assert load_config(None, []).tts.cosyvoice.flow.flush_share == 0.5
    with pytest.raises(ConfigError, match="flush_share must be above 0 and at most 1"):
        load_config(None, ["tts.cosyvoice.flow.flush_share=0"])


def test_a_bucket_is_padded_only_for_the_pass_that_captures_its_graph_or_replays_it():
    """An eager pass on a GPU runs at its own size: padding it to its bucket (rows copied up to the
    next of 1, 2, 4, 6, 8, 12, 16, 24, ..., frames to the next width) is work no graph ever uses."""
    from convtts.speak.cosyvoice.engine.solver import GraphCache

    cache = GraphCache(lambda *inputs: None, limit=1, capture_after=2)
    assert not cache.wants((24, 512))  # a first pass of its bucket: eager
    cache.skip((24, 512))
    assert cache.wants((24, 512))  # the second is captured (capture_after=2), so it is padded
    assert GraphCache(lambda *inputs: None, limit=1).wants((8, 256))  # by default the first pass captures
    assert not GraphCache(lambda *inputs: None, limit=0).wants((8, 256))  # no graphs: eager
    cache.skip((8, 256))
    assert cache.counts()[0] == 2  # eager passes count among the passes run


def test_an_eager_pass_is_priced_at_its_own_size_and_a_held_graph_or_a_capture_at_its_bucket():
    from convtts.speak.cosyvoice.engine.flow import Flow

    class Solver:  # the bucketed solver of a GPU with graphs, one graph held for (24, 512)
        bucketed, compiled = True, False

        def __init__(self):
            from convtts.speak.cosyvoice.engine.solver import GraphCache

            self.graphs = GraphCache(lambda *inputs: None, limit=4, capture_after=2)
            self.graphs.graphs[(24, 512)] = object()

        def key(self, rows, width):
            from convtts.speak.cosyvoice.engine.solver import rows_bucket, width_bucket

            return rows_bucket(rows), width_bucket(width)

        def pads(self, rows, width):
            return self.graphs.wants(self.key(rows, width))

    flow = Flow.__new__(Flow)
    flow.solver, flow.costs = Solver(), PassCosts(pass_ms=700.0, frame_us=18.0, replay_ms=60.0, capture_ms=150.0)
    assert flow.pass_seconds(13, 700) == pytest.approx((700.0 + 18.0 * 13 * 700 / 1000) / 1000)  # not 16 x 704
    assert flow.pass_seconds(20, 510) == pytest.approx((60.0 + 18.0 * 24 * 512 / 1000) / 1000)  # the graph's bucket
    flow.solver.graphs.skip((16, 704))  # the next pass of (16, 704) captures (capture_after=2)
    assert flow.pass_seconds(13, 700) == pytest.approx((150.0 + 18.0 * 16 * 704 / 1000) / 1000)


class RecordedGraphs:
    """GraphCache's capture recorded instead of a CUDA graph (no GPU here): a 'graph' replays the
    step on the static buffers it was captured with, so what each pass returns and what ran can be
    checked. The step: x = x * 2 + t."""

    def __init__(self, fails: int = 0, limit: int = 8):
        from convtts.speak.cosyvoice.engine.solver import Captured, GraphCache

        self.calls: list[str] = []
        self.fails = fails

        def step(x, t):
            self.calls.append("run")
            x.copy_(x * 2 + t)

        recorder = self

        class Recording(GraphCache):
            def _capture(self, key, inputs, step_inputs):
                recorder.calls.append("capture")
                if recorder.fails:
                    recorder.fails -= 1
                    self._capture_failed(RuntimeError("operation not permitted when stream is capturing"))
                    return None

                class Graph:
                    def replay(self):
                        recorder.calls.append("replay")
                        inputs[0].copy_(inputs[0] * 2 + step_inputs[0])

                entry = self.graphs[key] = Captured(Graph(), inputs, step_inputs)
                self.captures += 1
                return entry

        self.cache = Recording(step, limit=limit)

    def run(self, key, x: torch.Tensor, steps: int = 3) -> torch.Tensor:
        return self.cache.run(key, (x,), [(torch.tensor(float(t)),) for t in range(steps)])


def expected(x: torch.Tensor, steps: int = 3) -> torch.Tensor:
    for t in range(steps):
        x = x * 2 + t
    return x


def test_the_pass_that_captures_a_step_replays_it_for_every_step_and_later_passes_only_replay():
    """Recording a step's launches costs about what running it does: the pass that captures a shape
    replays the graph for all its steps (only the process's first run is eager, for the lazy set-up a
    capture must not record: that pass runs its first step eagerly and replays the rest)."""
    graphs = RecordedGraphs()
    first = graphs.run((4, 256), torch.ones(2))
    assert graphs.calls == ["run", "capture", "replay", "replay"] and torch.equal(first, expected(torch.ones(2)))
    graphs.calls.clear()
    second = graphs.run((8, 512), torch.full((3,), 5.0))
    assert graphs.calls == ["capture", "replay", "replay", "replay"]  # no eager step for a new shape
    assert torch.equal(second, expected(torch.full((3,), 5.0)))
    graphs.calls.clear()
    again = graphs.run((8, 512), torch.full((3,), 7.0))
    assert graphs.calls == ["replay"] * 3 and torch.equal(again, expected(torch.full((3,), 7.0)))
    assert graphs.cache.counts() == (3, 3, 2)  # passes, passes that replayed, captures


def test_an_eager_pass_outside_the_cache_warms_it_for_direct_captures():
    graphs = RecordedGraphs()
    graphs.cache.skip((2, 128))  # the solver ran this pass eagerly at its own size
    out = graphs.run((4, 256), torch.ones(2))
    assert graphs.calls == ["capture", "replay", "replay", "replay"] and torch.equal(out, expected(torch.ones(2)))


def test_the_graphs_share_input_buffers_and_a_larger_pass_replaces_them_and_the_graphs_on_them():
    graphs = RecordedGraphs()
    graphs.cache.skip((1, 16))
    graphs.run((4, 256), torch.ones(4))
    graphs.run((2, 128), torch.ones(2))
    small, large = graphs.cache.graphs[(2, 128)], graphs.cache.graphs[(4, 256)]
    assert small.inputs[0].data_ptr() == large.inputs[0].data_ptr()  # views of one buffer
    graphs.run((8, 512), torch.ones(40))  # more than the buffers hold (4 x 1.25)
    assert list(graphs.cache.graphs) == [(8, 512)]
    graphs.calls.clear()
    out = graphs.run((4, 256), torch.full((4,), 3.0))  # captured again, on the new buffers
    assert graphs.calls[0] == "capture" and torch.equal(out, expected(torch.full((4,), 3.0)))
    assert torch.equal(graphs.run((8, 512), torch.ones(40)), expected(torch.ones(40)))


def test_a_full_cache_drops_its_least_recently_used_graph_for_a_new_shape():
    graphs = RecordedGraphs(limit=2)
    graphs.cache.skip((1, 16))
    for key in ((4, 256), (8, 512), (4, 256), (16, 512)):
        graphs.run(key, torch.ones(2))
    assert list(graphs.cache.graphs) == [(4, 256), (16, 512)]  # (8, 512) was used least recently


def test_a_direct_capture_that_fails_runs_the_pass_eagerly_and_later_shapes_run_a_step_before_their_capture():
    graphs = RecordedGraphs(fails=1)
    graphs.cache.skip((1, 16))
    out = graphs.run((4, 256), torch.ones(2))  # the capture fails: the pass runs its steps eagerly
    assert graphs.calls == ["capture", "run", "run", "run"] and torch.equal(out, expected(torch.ones(2)))
    assert not graphs.cache.direct and not graphs.cache.broken
    graphs.calls.clear()
    out = graphs.run((8, 512), torch.full((3,), 5.0))
    assert graphs.calls == ["run", "capture", "replay", "replay"] and torch.equal(out, expected(torch.full((3,), 5.0)))
    graphs.calls.clear()
    graphs.fails = 1
    graphs.run((16, 512), torch.ones(2))  # fails again in the eager-first order: eager for good
    assert graphs.cache.broken
    graphs.calls.clear()
    out = graphs.run((32, 512), torch.ones(2))
    assert graphs.calls == ["run"] * 3 and torch.equal(out, expected(torch.ones(2)))
