"""CUDA graphs of a decode step, one per bucket of rows and cache length; eager where graphs cannot run.

Below every stage: the CosyVoice engine's LLM decode and the gate's Whisper decoder both step this way.

A decode step is a few hundred small kernels, each launched from Python: on an H200 the GPU
waits on the launches. Captured once per (rows, length) bucket and replayed, a step costs one
launch. The step function reads and writes only static buffers (the KV cache, each slot's
length and next token, the output), so a graph replays it as it was captured; whatever it
allocates inside is dead once the step ends, which is why every graph can share one memory pool.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from convtts.errors import is_out_of_memory

log = logging.getLogger(__name__)

LENGTH_STEP = 128  # cache length buckets: attention reads this many more positions at most


def row_buckets(max_rows: int) -> list[int]:
    """Row counts a graph is captured for: 1, 2, 4, then every 8, and max_rows (nano-vllm's scheme, finer)."""
    return [n for n in (1, 2, 4) if n < max_rows] + list(range(8, max_rows, 8)) + [max_rows]


def row_bucket(rows: int, max_rows: int) -> int:
    """The smallest bucket holding `rows` rows."""
    return next(b for b in row_buckets(max_rows) if b >= rows)


def length_bucket(length: int, capacity: int) -> int:
    """Cache positions a step attends over: `length` rounded up to LENGTH_STEP, at most the capacity."""
    return min(capacity, -(-length // LENGTH_STEP) * LENGTH_STEP)


class StepGraphs:
    """Runs `step(rows, length)` eagerly, compiled, and/or as one CUDA graph per bucket.

    `state` lists the small tensors the step updates in place (lengths, next tokens, sampler
    state): the warm-up run before a capture is undone on them, so capturing never advances a
    row. The KV positions it writes are written again, with the same values, by the real step.
    A capture or a compilation that fails leaves the step eager (logged once), never the run.
    """

    def __init__(
        self,
        step: Callable[[int, int], None],
        device: torch.device,
        graphs: bool,
        compile: bool,
        state: list[torch.Tensor],
        what: str = "the decode step",
    ):
        self.step = step
        self.what = what
        self.compiled = compile_step(step) if compile else None
        self.capture = graphs and device.type == "cuda"
        self.state = state
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = None
        if graphs and not self.capture:
            log.info("CUDA graphs asked for on %s: %s runs eagerly", device, what)

    def run(self, rows: int, length: int) -> None:
        if self.capture:
            graph = self.graphs.get((rows, length)) or self._capture(rows, length)
            if graph is not None:
                graph.replay()
                return
        self._eager(rows, length)

    def _eager(self, rows: int, length: int) -> None:
        if self.compiled is not None:
            try:
                self.compiled(rows, length)
                return
            except Exception as exc:  # compilation failed (before any kernel ran): eager from now on
                if is_out_of_memory(exc):
                    raise
                log.warning("torch.compile of %s failed (%s: %s): it runs eagerly", self.what, type(exc).__name__, exc)
                self.compiled = None
        self.step(rows, length)

    def _capture(self, rows: int, length: int) -> torch.cuda.CUDAGraph | None:
        saved = [t.clone() for t in self.state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: kernels picked, workspaces and lazy state made (and compiled)
            self._eager(rows, length)
        torch.cuda.current_stream().wait_stream(side)
        for tensor, before in zip(self.state, saved):
            tensor.copy_(before)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            # thread_local: the text frontend's thread may copy to the GPU meanwhile; only this thread is captured
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                (self.compiled or self.step)(rows, length)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            log.warning("CUDA graph capture of %s failed (%s: %s): it runs eagerly", self.what, type(exc).__name__, exc)
            self.capture = False
            self.clear()
            return None
        self.graphs[(rows, length)] = graph
        log.debug("captured %s for %d rows over %d positions (%d graphs)", self.what, rows, length, len(self.graphs))
        return graph

    def clear(self) -> None:
        """Drop the graphs (a replay may still run: it ends first)."""
        if self.graphs:
            torch.cuda.current_stream().synchronize()
        self.graphs.clear()
        self.pool = None


def compile_step(step: Callable[[int, int], None]) -> Callable[[int, int], None]:
    """torch.compile's fused kernels for the step (no CUDA graphs of its own: StepGraphs captures).

    Rows and length change between calls: automatic dynamic shapes compile it a few times, not
    once per bucket; the recompile limit is raised so that no bucket falls back to eager.
    """
    import torch._dynamo

    own_cache_for_capability()
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), 64))
    return torch.compile(step, dynamic=None)


def own_cache_for_capability() -> None:
    """Compiled CPU kernels kept apart for each ATEN_CPU_CAPABILITY (where the user names no cache).

    Inductor's cache does not tell kernels built under one capability from those built under
    another: a process with ATEN_CPU_CAPABILITY=avx2 that loads kernels cached by a default run
    (AVX-512 on such a CPU) dies with SIGBUS inside them (torch 2.9).
    """
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if not capability or "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default_cache_dir(), f"cpu-{capability}")
