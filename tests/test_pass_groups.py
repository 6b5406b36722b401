"""The cut of a flush's rows into flow and vocoder passes by their costs (flow.py: cheapest_groups)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from convtts.config import ConfigError, load_config
from convtts.speak.cosyvoice.engine.flow import PassCosts, cheapest_groups, length_groups


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


def test_grouping_is_cost_by_default_and_checked():
    flow = load_config(None, []).tts.cosyvoice.flow
    assert flow.grouping == "cost" and PassCosts.configured(flow) is not None
    spread = load_config(None, ["tts.cosyvoice.flow.grouping=spread"]).tts.cosyvoice.flow
    assert PassCosts.configured(spread) is None and PassCosts.vocoder(spread) is None
    with pytest.raises(ConfigError, match="grouping must be cost or spread"):
        load_config(None, ["tts.cosyvoice.flow.grouping=widest"])
    with pytest.raises(ConfigError, match="pass_ms must be between"):
        load_config(None, ["tts.cosyvoice.flow.pass_ms=-1"])


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
    cache.graphs[(24, 512)] = object()  # held: every pass replays it
    cache.seen[(24, 512)] = 5
    cache.skip((8, 256))
    assert cache.wants((24, 512)) and not cache.wants((8, 256))  # the one graph is kept: seen more often
    assert cache.counts()[0] == 6  # eager passes count among the passes run


def test_an_eager_pass_is_priced_at_its_own_size_and_a_held_graph_at_its_bucket():
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
    flow.solver, flow.costs = Solver(), PassCosts(pass_ms=700.0, frame_us=18.0, replay_ms=60.0)
    assert flow.pass_seconds(13, 700) == pytest.approx((700.0 + 18.0 * 13 * 700 / 1000) / 1000)  # not 16 x 704
    assert flow.pass_seconds(20, 510) == pytest.approx((60.0 + 18.0 * 24 * 512 / 1000) / 1000)  # the graph's bucket


class RecordedGraphs:
    """GraphCache's capture recorded instead of a CUDA graph (no GPU here): a 'graph' replays the
    function on its static inputs, so what each pass returns and what ran can be checked."""

    def __init__(self, fails: int = 0):
        from convtts.speak.cosyvoice.engine.solver import Captured, GraphCache

        self.calls: list[str] = []
        self.fails = fails

        def fn(x):
            self.calls.append("run")
            return x * 2

        recorder = self

        class Recording(GraphCache):
            def _capture(self, key, inputs):
                recorder.calls.append("capture")
                if recorder.fails:
                    recorder.fails -= 1
                    self._capture_failed(RuntimeError("operation not permitted when stream is capturing"))
                    return None
                static = tuple(t.clone() for t in inputs)
                output = torch.empty_like(static[0])

                class Graph:
                    def replay(self):
                        recorder.calls.append("replay")
                        output.copy_(static[0] * 2)

                entry = self.graphs[key] = Captured(Graph(), static, output)
                self.captures += 1
                return entry

        self.cache = Recording(fn, limit=8, capture_after=1)


def test_a_graph_is_captured_and_replayed_by_the_pass_that_admits_it_once_the_function_has_run_eagerly():
    """Recording a pass's launches costs about what running them does: the pass that captures a
    shape replays the graph for its result instead of also running eagerly (only the process's first
    run is eager, for the lazy set-up a capture must not record)."""
    graphs = RecordedGraphs()
    first = graphs.cache.run((4, 256), (torch.ones(2),))
    assert graphs.calls == ["run", "capture"] and torch.equal(first, torch.full((2,), 2.0))
    graphs.calls.clear()
    second = graphs.cache.run((8, 512), (torch.full((3,), 5.0),))
    assert graphs.calls == ["capture", "replay"]  # no eager run of the new shape
    assert torch.equal(second, torch.full((3,), 10.0))
    graphs.calls.clear()
    again = graphs.cache.run((8, 512), (torch.full((3,), 7.0),))
    assert graphs.calls == ["replay"] and torch.equal(again, torch.full((3,), 14.0))
    assert graphs.cache.counts() == (3, 2, 2)  # passes, replays, captures


def test_an_eager_pass_outside_the_cache_warms_it_for_direct_captures():
    graphs = RecordedGraphs()
    graphs.cache.skip((2, 128))  # the solver ran this pass eagerly at its own size
    out = graphs.cache.run((4, 256), (torch.ones(2),))
    assert graphs.calls == ["capture", "replay"] and torch.equal(out, torch.full((2,), 2.0))


def test_a_direct_capture_that_fails_runs_the_pass_eagerly_and_later_shapes_run_eagerly_before_their_capture():
    graphs = RecordedGraphs(fails=1)
    graphs.cache.run((4, 256), (torch.ones(2),))  # eager (the warm-up), then its capture fails
    assert graphs.calls == ["run", "capture"] and not graphs.cache.direct and not graphs.cache.broken
    graphs.calls.clear()
    out = graphs.cache.run((8, 512), (torch.full((3,), 5.0),))
    assert graphs.calls == ["run", "capture"] and torch.equal(out, torch.full((3,), 10.0))
    graphs.calls.clear()
    graphs.fails = 1
    graphs.cache.run((16, 512), (torch.ones(2),))  # fails again in the eager-first order: eager for good
    assert graphs.cache.broken
    graphs.calls.clear()
    graphs.cache.run((32, 512), (torch.ones(2),))
    assert graphs.calls == ["run"]
