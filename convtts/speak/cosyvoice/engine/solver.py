"""The flow's Euler solve for a padded pass: upstream's estimator, the padding-safe one, bucketed, in CUDA graphs.

A flow pass is ten estimator calls on 2 x rows (classifier-free guidance), each some 12,000 small
torch calls: on a GPU the launches, not the arithmetic, set its time (an eager v1 pass 0.6-1.2 s
on an H200, however few its rows). So on a GPU one guided step is captured as a CUDA graph per
shape and replayed ten times a pass: capturing records one step's launches, a tenth of what an
eager pass runs, so even a shape met once gains. Shapes are bucketed to make them repeat: rows up
to the next of tts.cosyvoice.flow.row_buckets (extra rows copy the last real one), frames up to the next width_bucket
(tts.cosyvoice.flow.frame_buckets widths a doubling: at most 1/8 more by default, padded with zeros
and masked). The padding-safe estimator (estimator.py) keeps every row equal to its solo rendering
up to float rounding, whatever the bucket adds.

Modes, from the reference to the fastest:
- eager, unpadded pass in fp32/tf32: upstream's own estimator (a pass of one row is upstream's
  inference sample for sample);
- eager, padded pass or bf16/fp16: the padding-safe estimator, at the pass's own shape;
- bucketed (a GPU with tts.cosyvoice.cuda_graphs): padded to its bucket, one step captured per
  bucket from its `capture_after`-th pass and replayed for the ten steps, at most `max_graphs`
  kept (the least recently used go first); every graph reads one set of input buffers and shares
  one memory pool; torch.compile of the estimator when flow.compile is set.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass

import torch

from convtts.config import FlowConfig
from convtts.cuda_graphs import own_cache_for_capability
from convtts.speak.base import is_out_of_memory
from convtts.speak.cosyvoice.engine import flow_attention
from convtts.speak.cosyvoice.engine.attention import kernel_chosen
from convtts.speak.cosyvoice.engine.estimator import first_attention, padded_forward
from convtts.speak.cosyvoice.engine.precision import is_reduced, matmul_mode, part_module

log = logging.getLogger(__name__)

STEPS = 10  # upstream's n_timesteps
ROW_BUCKETS = FlowConfig.row_buckets  # the rows a pass is padded up to, unless configured


def rows_bucket(rows: int, buckets: tuple[int, ...] = ROW_BUCKETS) -> int:
    """The first of `buckets` that holds `rows`; past the last, the next multiple of 32."""
    for size in buckets:
        if rows <= size:
            return size
    return -(-rows // 32) * 32


def width_bucket(frames: int, per_octave: int = 8) -> int:
    """frames rounded up to a multiple of 16, or, when larger, to the next of `per_octave` widths
    between two powers of two (8: at most 1/8 more; 2: at most 1/2)."""
    step = max(16, 1 << max(0, frames.bit_length() - per_octave.bit_length()))
    return -(-frames // step) * step


def times(device, dtype, cosine: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Upstream's (t, dt) of each Euler step, computed as its solve_euler does (t accumulates dt)."""
    t_span = torch.linspace(0, 1, STEPS + 1, device=device, dtype=dtype)
    if cosine:
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
    t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
    out = []
    for step in range(1, STEPS + 1):
        out.append((t, dt.reshape(1)))  # one shape for every step's dt (the first is a scalar upstream)
        t = t + dt
        if step < STEPS:
            dt = t_span[step + 1] - t
    return out


def doubled(mask, mu, spks, cond) -> tuple:
    """The inputs of a guided estimator call: the rows conditioned, then again with mu, speaker and
    prompt zeroed."""
    zeros = torch.zeros_like(mu)
    return (
        torch.cat([mask, mask]),
        torch.cat([mu, zeros]),
        torch.cat([spks, torch.zeros_like(spks)]),
        torch.cat([cond, zeros]),
    )


def guided(estimate, x, mask2, mu2, spks2, cond2, t, dt, rate: float) -> torch.Tensor:
    """One Euler step with classifier-free guidance; the update and the state stay in fp32 whatever
    the estimator's format."""
    batch = x.shape[0]
    out = estimate(torch.cat([x, x]), mask2, mu2, t.expand(2 * batch).contiguous(), spks2, cond2)
    conditioned, free = torch.split(out, [batch, batch], dim=0)
    return x + dt * ((1.0 + rate) * conditioned - rate * free)


def euler(estimate, x, mask, mu, spks, cond, cosine: bool, rate: float) -> torch.Tensor:
    """Upstream's solve_euler with classifier-free guidance, for any number of rows."""
    pair = doubled(mask, mu, spks, cond)
    for t, dt in times(x.device, mu.dtype, cosine):
        x = guided(estimate, x, *pair, t, dt, rate)
    return x


@dataclass
class Captured:
    graph: object
    inputs: tuple  # the pass's inputs, the state first (the step updates it in place)
    step: tuple  # each step's own inputs


class Staging:
    """The static inputs of every graph of a cache: one flat buffer a position, each graph reading
    views of their start (graphs never run at once, so they can share them). Sized to the largest
    pass so far; growing them makes new buffers, so the graphs on the old ones must go."""

    HEADROOM = 1.25

    def __init__(self):
        self.buffers: list[torch.Tensor] = []

    def fits(self, inputs: tuple) -> bool:
        return len(self.buffers) == len(inputs) and all(
            b.dtype == t.dtype and b.device == t.device and b.numel() >= t.numel() for b, t in zip(self.buffers, inputs)
        )

    def grow(self, inputs: tuple) -> None:
        self.buffers = [
            torch.empty(max(1, int(t.numel() * self.HEADROOM)), dtype=t.dtype, device=t.device) for t in inputs
        ]

    def views(self, inputs: tuple) -> tuple:
        return tuple(b[: t.numel()].view(t.shape) for b, t in zip(self.buffers, inputs))


class GraphCache:
    """One CUDA graph per bucket of a step that updates its state (its first input) in place, replayed
    once a step of a loop: `step(*inputs, *step_inputs)`.

    Capturing records the step's launches, which costs the CPU about what running it does, so the
    pass that captures a bucket's graph replays it for all its steps. Only the process's first run of
    the step is eager, for the lazy set-up (libraries' handles, workspaces) a capture must not
    record; a capture that fails after it falls back to running each new shape's first step eagerly
    before its capture, and then, if that fails too, to eager for good.
    """

    def __init__(self, step, limit: int, capture_after: int = 1):
        self.step, self.limit, self.capture_after = step, limit, capture_after
        self.graphs: OrderedDict = OrderedDict()  # least recently used first
        self.seen: Counter = Counter()
        self.staging = Staging()
        self.pool = None
        self.broken = False  # a capture failed after an eager warm-up: eager from then on
        self.warm = False  # the step has run eagerly in this process
        self.direct = True  # capture without an eager run of the shape's first step
        self.replays = 0
        self.captures = 0

    def run(self, key, inputs: tuple, steps: list[tuple]) -> torch.Tensor:
        """The state after every step, for the pass's `inputs` and each step's `steps`."""
        self.seen[key] += 1
        entry = self.graphs.get(key)
        if entry is None and self._may_capture(key):
            return self._capture_and_run(key, inputs, steps)
        if entry is None:
            return self._eager(inputs, steps)
        self.graphs.move_to_end(key)
        for static, value in zip(entry.inputs, inputs):
            static.copy_(value)
        return self._replay(entry, steps)

    def _eager(self, inputs: tuple, steps: list[tuple]) -> torch.Tensor:
        state = inputs[0].clone()
        for values in steps:
            self.step(state, *inputs[1:], *values)
        self.warm = True
        return state

    def _replay(self, entry: Captured, steps: list[tuple]) -> torch.Tensor:
        for values in steps:
            for static, value in zip(entry.step, values):
                static.copy_(value)
            entry.graph.replay()
        self.replays += 1
        return entry.inputs[0].clone()  # before another graph on the same buffers runs

    def wants(self, key) -> bool:
        """Whether the next pass of this bucket replays or captures a graph (padded to the bucket); else it
        runs eagerly, and padding it would only add work."""
        return key in self.graphs or self._may_capture(key, self.seen[key] + 1)

    def skip(self, key) -> None:
        """A pass of this bucket runs eagerly outside the cache: it counts towards the bucket's capture, and
        once it has run, the step's lazy set-up is done."""
        self.seen[key] += 1
        self.warm = True

    def _may_capture(self, key, seen: int | None = None) -> bool:
        seen = self.seen[key] if seen is None else seen
        return not self.broken and self.limit > 0 and seen >= self.capture_after

    def _capture_and_run(self, key, inputs: tuple, steps: list[tuple]) -> torch.Tensor:
        staged = tuple(inputs) + tuple(steps[0])
        if not self.staging.fits(staged):
            self.clear()  # their graphs read the buffers being replaced
            self.staging.grow(staged)
        while len(self.graphs) >= self.limit:
            self.graphs.popitem(last=False)
        static = self.staging.views(staged)
        for buffer, value in zip(static, staged):
            buffer.copy_(value)
        done = 0
        if not (self.warm and self.direct):  # the shape's first step runs eagerly, then the capture
            self.step(*static)
            self.warm, done = True, 1
        entry = self._capture(key, static[: len(inputs)], static[len(inputs) :])
        if entry is None:
            for values in steps[done:]:
                for buffer, value in zip(static[len(inputs) :], values):
                    buffer.copy_(value)
                self.step(*static)
            return static[0].clone()
        return self._replay(entry, steps[done:]) if done < len(steps) else static[0].clone()

    def _capture(self, key, inputs: tuple, step: tuple) -> Captured | None:
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                self.step(*inputs, *step)
        except Exception as exc:
            if is_out_of_memory(exc):
                self.clear()  # give their memory back; the caller's next pass decides
                raise
            self._capture_failed(exc)
            return None
        entry = self.graphs[key] = Captured(graph, inputs, step)
        self.captures += 1
        return entry

    def _capture_failed(self, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        if self.direct:  # an eager run of each shape's first step may be what it needed
            self.direct = False
            log.warning(
                "the flow's CUDA graph capture failed (%s); each shape runs a step eagerly before its capture", reason
            )
        else:
            self.broken = True
            log.warning("the flow's CUDA graph capture failed (%s); the flow runs eagerly", reason)

    def clear(self) -> None:
        """Drop the graphs, their memory pool and the input buffers."""
        self.graphs.clear()
        self.pool = None
        self.staging = Staging()

    def holds(self, key) -> bool:
        """Whether a pass of this bucket would replay a graph now."""
        return key in self.graphs

    def counts(self) -> tuple[int, int, int]:
        """Passes run so far, how many replayed a graph, and graphs captured."""
        return sum(self.seen.values()), self.replays, self.captures


class Solver:
    """The Euler solve of one engine's flow: its estimator(s), precision and mode."""

    def __init__(
        self,
        decoder,
        precision: str,
        graphs: bool,
        compile: bool,
        max_graphs: int,
        device,
        bucket: bool | None = None,
        frame_buckets: int = 8,
        capture_after: int = 1,
        row_buckets: tuple[int, ...] = ROW_BUCKETS,
        attention: str = "torch",
    ):
        """`bucket` None: bucketed on a GPU with graphs or compile; True pads to buckets anywhere (tests).
        `attention`: tts.cosyvoice.flow.attention."""
        self.decoder = decoder
        self.frame_buckets, self.row_buckets = frame_buckets, row_buckets
        self.precision = precision
        self.causal = type(decoder).__name__ == "CausalConditionalCFM"
        self.cosine = decoder.t_scheduler == "cosine"
        self.rate = float(decoder.inference_cfg_rate)
        # v3's rotary angles stay fp32: bf16 positions are not whole numbers past 256 frames
        keep = ("rotary_embed",) if hasattr(decoder.estimator, "rotary_embed") else ()
        self.estimator = part_module(decoder.estimator, precision, keep)
        self.kernel = self._kernel(attention, device)
        self.safe = padded_forward(self.estimator, owned=is_reduced(precision), kernel=self.kernel)
        if self.safe is None:
            log.warning(
                "unknown flow estimator %s: padded passes use upstream's forward", type(decoder.estimator).__name__
            )
        on_gpu = torch.device(device).type == "cuda"
        self.bucketed = self.safe is not None and (on_gpu and (graphs or compile) if bucket is None else bucket)
        self.compiled = compile and self.safe is not None  # compiled per bucket shape: every pass is padded
        if self.compiled:
            self.safe = compiled(self.safe)
        self.graphs = GraphCache(self._step, max_graphs if graphs and on_gpu else 0, capture_after)
        self.times: dict = {}  # (device, dtype): the steps' (t, dt)

    def _kernel(self, choice: str, device) -> bool:
        """Whether the flow's attention reads each row's own frames (flow_attention.py): asked for or auto, where
        Triton runs and the kernel passes its check for the estimator's head width and format."""
        attn = first_attention(self.estimator)
        if attn is None:
            return False
        dim = attn.to_q.weight.shape[0] // attn.heads
        return kernel_chosen(
            choice,
            device,
            "tts.cosyvoice.flow.attention",
            "the flow's attention",
            lambda: flow_attention.works(str(device), dim, attn.to_q.weight.dtype),
        )

    def solve(self, x, mask, mu, spks, cond, frames: list[int]) -> torch.Tensor:
        """x after the ten steps, for rows padded to x's width; `frames` are each row's own."""
        with matmul_mode(self.precision):
            if self.bucketed and x.device.type == "cuda" and not self.pads(x.shape[0], x.shape[2]):
                self.graphs.skip(self.key(x.shape[0], x.shape[2]))
                return self._solve_safe(x, mask, mu, spks, cond)
            if self.bucketed:
                try:
                    return self._bucketed(x, mask, mu, spks, cond)
                except Exception as exc:
                    if is_out_of_memory(exc):  # the engine will shrink its rows: the graphs' memory goes first
                        self.graphs.clear()
                    raise
            if self.safe is None or (not is_reduced(self.precision) and min(frames) == x.shape[2]):
                return euler(self._upstream, x, mask, mu, spks, cond, self.cosine, self.rate)
            return self._solve_safe(x, mask, mu, spks, cond)

    def _upstream(self, x, mask, mu, t, spks, cond):
        options = {"streaming": False} if self.causal else {}
        return self.decoder.forward_estimator(x, mask, mu, t, spks, cond, **options)

    def _solve_safe(self, x, mask, mu, spks, cond):
        return euler(self.safe, x, mask, mu, spks, cond, self.cosine, self.rate)

    def _step(self, x, mask, mu, spks, cond, t, dt) -> None:
        """One guided step of the padding-safe estimator, x updated in place (what a graph captures)."""
        x.copy_(guided(self.safe, x, *doubled(mask, mu, spks, cond), t, dt, self.rate))

    def _times(self, mu: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        key = (mu.device, mu.dtype)
        if key not in self.times:
            self.times[key] = times(mu.device, mu.dtype, self.cosine)
        return self.times[key]

    def _bucketed(self, x, mask, mu, spks, cond):
        rows, width = x.shape[0], x.shape[2]
        key = self.key(rows, width)
        inputs = pad_pass((x, mask, mu, cond), spks, *key)
        if self.graphs.limit <= 0:  # the bucketed shapes without graphs (compiled, or tests on a CPU)
            return self._solve_safe(*inputs)[:rows, :, :width]
        return self.graphs.run(key, inputs, self._times(mu))[:rows, :, :width]

    def key(self, rows: int, width: int) -> tuple[int, int]:
        """The bucket of a pass of `rows` rows padded to `width` frames."""
        return rows_bucket(rows, self.row_buckets), width_bucket(width, self.frame_buckets)

    def pads(self, rows: int, width: int) -> bool:
        """Whether a pass of this size is padded to its bucket: where it may replay or capture a graph, or
        on a CPU (tests of the bucketed shapes); an eager pass on a GPU runs at its own size."""
        if not self.bucketed:
            return False
        return self.compiled or self.graphs.limit <= 0 or self.graphs.wants(self.key(rows, width))


def pad_pass(frames_first: tuple, spks: torch.Tensor, rows: int, width: int) -> tuple:
    """(x, mask, mu, spks, cond) padded to `rows` (copies of the last row) and `width` (zeros)."""

    def grow(t: torch.Tensor) -> torch.Tensor:
        extra = rows - t.shape[0]
        return torch.cat([t, t[-1:].expand(extra, *t.shape[1:])]) if extra else t

    x, mask, mu, cond = (grow(torch.nn.functional.pad(t, (0, width - t.shape[2]))) for t in frames_first)
    return x, mask, mu, grow(spks), cond


def compiled(fn):
    """torch.compile of the estimator, one graph per bucket shape (dynamic shapes would be slower)."""
    import torch._dynamo

    own_cache_for_capability()
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(fn, dynamic=False)
