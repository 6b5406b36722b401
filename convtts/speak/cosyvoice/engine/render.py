"""The flow and vocoder passes of decoded rows, either in the decode's own thread or beside it.

In one thread, every flow pass stops the decode: on an H200 with 12 workers of 64 rows a worker
spent 64% of its time in flow passes (3.4 s each) and 17% decoding, so a row of 10 s of audio,
500 decode steps of about 10 ms, took 35-45 s to come out. Beside it (`tts.cosyvoice.flow.overlap`),
the passes run on a thread of their own, on a CUDA stream of their own, one job at a time, while
the decode goes on stepping the rows that are still running; decoded rows gather meanwhile for the
next job. What a pass computes does not change: each row's noise comes from its own utterance's
streams (requests.own_random_stream, under one lock), so a row's audio is the same either way.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from convtts.speak.cosyvoice.engine.audio import AudioStage
from convtts.speak.cosyvoice.engine.precision import matmul_mode
from convtts.speak.cosyvoice.engine.requests import Sequence

def tf32_agrees(parts: list[str]) -> bool:
    """Whether the parts ask for the same TF32 switch (all tf32, or none): TF32 is one switch for the
    whole process, so two threads may run side by side only if neither needs it set otherwise."""
    return len({part == "tf32" for part in parts}) == 1


class Renderer:
    """Runs AudioStage.render for a list of decoded rows: at once (`overlap` off) or as a job beside
    the decode; `take` hands back the rows of a finished job."""

    def __init__(self, audio: AudioStage, device: torch.device, timer, overlap: bool):
        self.audio, self.device, self.timer = audio, device, timer
        self.overlap = overlap
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="render") if overlap else None
        self.stream = torch.cuda.Stream(device) if overlap and device.type == "cuda" else None
        self.job: tuple[list[Sequence], Future] | None = None

    def busy(self) -> bool:
        return self.job is not None

    def render(self, seqs: list[Sequence], speed: float) -> list[Sequence] | None:
        """Render `seqs` now and return them, or (overlapping) start a job and return None."""
        if not self.overlap:
            with self.timer("flow"):
                self.audio.render(renderable(seqs), speed)
            return seqs
        ready = None
        if self.stream is not None:  # the rows' inputs were made on the decode's stream
            ready = torch.cuda.Event()
            ready.record()
        self.job = seqs, self.pool.submit(self._job, seqs, speed, ready)
        return None

    def _job(self, seqs: list[Sequence], speed: float, ready) -> None:
        with torch.inference_mode(), self.timer("render"):
            if self.stream is None:
                self.audio.render(renderable(seqs), speed)
                return
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(ready)
                self.audio.render(renderable(seqs), speed)
            self.stream.synchronize()  # the rows' tensors may be freed by the decode's thread next

    def take(self, wait: bool) -> list[Sequence]:
        """The rows of the job, once it is done (waiting for it with `wait`); [] if none is, or none ran.
        A job's error (a CUDA out-of-memory) is raised here, in the decode's thread."""
        if self.job is None or not (wait or self.job[1].done()):
            return []
        seqs, future = self.job
        if not future.done():
            with self.timer("wait"):
                future.exception()
        self.job = None
        future.result()
        return seqs

    def settle(self) -> None:
        """Wait for a job still under way (its rows are the caller's to hand back); its error is dropped."""
        if self.job is not None:
            self.job[1].exception()
            self.job = None

    def close(self) -> None:
        self.settle()
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def renderable(seqs: list[Sequence]) -> list[Sequence]:
    """The rows the flow gets: decoded without an error, and with tokens to speak."""
    return [seq for seq in seqs if seq.request.error is None and seq.kept]


def common_tf32(parts: list[str]):
    """The TF32 switch set once for a whole call whose parts run side by side (see tf32_agrees)."""
    return matmul_mode("tf32" if parts[0] == "tf32" else "fp32")
