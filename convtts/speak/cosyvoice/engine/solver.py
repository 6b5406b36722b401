"""The flow's Euler solve for a padded pass: upstream's estimator, the padding-safe one, bucketed, in CUDA graphs.

A flow pass is ten estimator calls on 2 x rows (classifier-free guidance), each a few hundred
small kernels: on a GPU the launches, not the arithmetic, set its time. The solve is a pure
function of its inputs, so on a GPU it is captured once per shape and replayed. Shapes are
bucketed to make them repeat: rows up to the next of ROW_BUCKETS (extra rows copy the last real
one), frames up to the next width_bucket (tts.cosyvoice.flow.frame_buckets widths a doubling: at
most 1/8 more by default, padded with zeros and masked). The
padding-safe estimator (estimator.py) keeps every row equal to its solo rendering up to float
rounding, whatever the bucket adds.

Modes, from the reference to the fastest:
- eager, unpadded pass in fp32/tf32: upstream's own estimator (a pass of one row is upstream's
  inference sample for sample);
- eager, padded pass or bf16/fp16: the padding-safe estimator, at the pass's own shape;
- bucketed (a GPU with tts.cosyvoice.cuda_graphs): padded to its bucket, captured as one graph
  for all ten steps from a bucket's `capture_after`-th pass, at most `max_graphs` kept (the most
  used), all sharing one memory pool; torch.compile of the estimator when flow.compile is set.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import torch

from convtts.speak.base import is_out_of_memory
from convtts.speak.cosyvoice.engine.estimator import padded_forward
from convtts.speak.cosyvoice.engine.precision import is_reduced, matmul_mode, part_module

log = logging.getLogger(__name__)

STEPS = 10  # upstream's n_timesteps
ROW_BUCKETS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def rows_bucket(rows: int) -> int:
    for size in ROW_BUCKETS:
        if rows <= size:
            return size
    return -(-rows // 32) * 32


def width_bucket(frames: int, per_octave: int = 8) -> int:
    """frames rounded up to a multiple of 16, or, when larger, to the next of `per_octave` widths
    between two powers of two (8: at most 1/8 more; 2: at most 1/2)."""
    step = max(16, 1 << max(0, frames.bit_length() - per_octave.bit_length()))
    return -(-frames // step) * step


def euler(estimate, x, mask, mu, spks, cond, cosine: bool, rate: float) -> torch.Tensor:
    """Upstream's solve_euler with classifier-free guidance, for any number of rows.

    The first half of each estimator call is conditioned, the second has mu, speaker and prompt
    zeroed; the guided update and the state x stay in fp32 whatever the estimator's format.
    """
    batch = x.shape[0]
    t_span = torch.linspace(0, 1, STEPS + 1, device=x.device, dtype=mu.dtype)
    if cosine:
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
    t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
    zeros = torch.zeros_like(mu)
    mask2, mu2 = torch.cat([mask, mask]), torch.cat([mu, zeros])
    spks2, cond2 = torch.cat([spks, torch.zeros_like(spks)]), torch.cat([cond, zeros])
    for step in range(1, len(t_span)):
        out = estimate(torch.cat([x, x]), mask2, mu2, t.expand(2 * batch).contiguous(), spks2, cond2)
        guided, free = torch.split(out, [batch, batch], dim=0)
        x = x + dt * ((1.0 + rate) * guided - rate * free)
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return x


@dataclass
class Captured:
    graph: object
    inputs: tuple
    output: torch.Tensor


class GraphCache:
    """One CUDA graph per bucket of a pure function of tensors, captured from a bucket's
    `capture_after`-th pass (one-off shapes stay eager).

    The pass that captures a graph replays it for its result: recording the launches costs the CPU
    about what running them does (0.3-0.6 s against an eager flow solve's 0.6-1.2 s, H200), so a
    shape's first graphed pass costs no more than an eager one. Only the process's first run of
    `fn` is eager, for the lazy set-up (libraries' handles, workspaces) a capture must not record;
    a capture that fails after it falls back to that order (eager, then capture) for good.

    When `limit` graphs are held, a bucket seen more often than the least seen of them takes its
    place; one seen as often waits (churn would cost a capture per pass for no replay).
    """

    def __init__(self, fn, limit: int, capture_after: int = 2):
        self.fn, self.limit, self.capture_after = fn, limit, capture_after
        self.graphs: dict = {}
        self.seen: Counter = Counter()
        self.pool = None
        self.broken = False  # a capture failed after an eager warm-up: eager from then on
        self.warm = False  # fn has run eagerly in this process
        self.direct = True  # capture without an eager run of the same pass first
        self.replays = 0
        self.captures = 0

    def run(self, key, inputs: tuple) -> torch.Tensor:
        self.seen[key] += 1
        entry = self.graphs.get(key)
        if entry is None and self._admit(key):
            if self.warm and self.direct:
                entry = self._capture(key, inputs)
            else:
                out = self._eager(inputs)
                self._capture(key, inputs)
                return out
        if entry is None:
            return self._eager(inputs)
        for static, value in zip(entry.inputs, inputs):
            static.copy_(value)
        entry.graph.replay()
        self.replays += 1
        return entry.output.clone()  # before any other graph of the shared pool runs

    def _eager(self, inputs: tuple) -> torch.Tensor:
        out = self.fn(*inputs)
        self.warm = True
        return out

    def wants(self, key) -> bool:
        """Whether the next pass of this bucket replays or captures a graph (padded to the bucket); else it
        runs eagerly, and padding it would only add work."""
        return key in self.graphs or self._may_capture(key, self.seen[key] + 1)

    def skip(self, key) -> None:
        """A pass of this bucket runs eagerly outside the cache: it counts towards the bucket's capture, and
        once it has run, fn's lazy set-up is done."""
        self.seen[key] += 1
        self.warm = True

    def _may_capture(self, key, seen: int) -> bool:
        if self.broken or self.limit <= 0 or seen < self.capture_after:
            return False
        return len(self.graphs) < self.limit or min(self.seen[k] for k in self.graphs) < seen

    def _admit(self, key) -> bool:
        if not self._may_capture(key, self.seen[key]):
            return False
        if len(self.graphs) >= self.limit:
            del self.graphs[min(self.graphs, key=lambda k: self.seen[k])]
        return True

    def clear(self) -> None:
        self.graphs.clear()

    def holds(self, key) -> bool:
        """Whether a pass of this bucket would replay a graph now."""
        return key in self.graphs

    def _capture(self, key, inputs: tuple) -> Captured | None:
        static = tuple(t.clone() for t in inputs)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                output = self.fn(*static)
        except Exception as exc:
            if is_out_of_memory(exc):
                self.clear()  # give their memory back; the caller's next pass decides
                raise
            self._capture_failed(exc)
            return None
        entry = self.graphs[key] = Captured(graph, static, output)
        self.captures += 1
        return entry

    def _capture_failed(self, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        if self.direct:  # an eager run of each shape first may be what it needed
            self.direct = False
            log.warning("the flow's CUDA graph capture failed (%s); each shape runs eagerly before its capture", reason)
        else:
            self.broken = True
            log.warning("the flow's CUDA graph capture failed (%s); the flow runs eagerly", reason)

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
        capture_after: int = 2,
    ):
        """`bucket` None: bucketed on a GPU with graphs or compile; True pads to buckets anywhere (tests)."""
        self.decoder = decoder
        self.frame_buckets = frame_buckets
        self.precision = precision
        self.causal = type(decoder).__name__ == "CausalConditionalCFM"
        self.cosine = decoder.t_scheduler == "cosine"
        self.rate = float(decoder.inference_cfg_rate)
        self.estimator = part_module(decoder.estimator, precision)
        self.safe = padded_forward(self.estimator)
        if self.safe is None:
            log.warning(
                "unknown flow estimator %s: padded passes use upstream's forward", type(decoder.estimator).__name__
            )
        on_gpu = torch.device(device).type == "cuda"
        self.bucketed = self.safe is not None and (on_gpu and (graphs or compile) if bucket is None else bucket)
        self.compiled = compile and self.safe is not None  # compiled per bucket shape: every pass is padded
        if self.compiled:
            self.safe = compiled(self.safe)
        self.graphs = GraphCache(self._solve_safe, max_graphs if graphs and on_gpu else 0, capture_after)

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

    def _bucketed(self, x, mask, mu, spks, cond):
        rows, width = x.shape[0], x.shape[2]
        key = self.key(rows, width)
        inputs = pad_pass((x, mask, mu, cond), spks, *key)
        if x.device.type != "cuda":  # the bucketed shapes without a GPU to capture them (tests)
            return self._solve_safe(*inputs)[:rows, :, :width]
        return self.graphs.run(key, inputs)[:rows, :, :width]

    def key(self, rows: int, width: int) -> tuple[int, int]:
        """The bucket of a pass of `rows` rows padded to `width` frames."""
        return rows_bucket(rows), width_bucket(width, self.frame_buckets)

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

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(fn, dynamic=False)
