"""The engine's two CUDA streams: the decode on the GPU's highest-priority stream, the flow and vocoder on the
default one (tts.cosyvoice.decode_priority).

A GPU under MPS runs every worker's kernels at once. A decode step is a few hundred small kernels,
each of which waited behind the blocks of other workers' flow passes, so a row advanced about one
step in 70 ms where the step itself takes a few: a full GPU's longest rows lived 35-50 s. On a
high-priority stream the decode's blocks go to the next free multiprocessor before the flow's.
Within a worker nothing changes order: the engine's loop is one thread and renders between steps,
as before; the decode waits for the render stream where it reads what the text frontend put there.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

HIGHEST = -100  # torch maps a priority past the device's range to its highest


class Streams:
    """`decoding()` around the engine's loop, `rendering()` around each flow and vocoder pass; on the CPU,
    or with decode_priority normal, both are the caller's stream."""

    def __init__(self, device: torch.device, priority: str):
        self.on = device.type == "cuda" and priority == "high"
        if self.on:
            self.render = torch.cuda.current_stream(device)
            self.decode = torch.cuda.Stream(device, priority=HIGHEST)

    @contextmanager
    def decoding(self):
        if not self.on:
            yield
            return
        self.decode.wait_stream(self.render)  # the model's load and anything queued before this call
        try:
            with torch.cuda.stream(self.decode):
                yield
        finally:
            self.render.wait_stream(self.decode)  # what the caller queues next sees the decode's work

    @contextmanager
    def rendering(self):
        if not self.on:
            yield
            return
        with torch.cuda.stream(self.render):
            yield

    def inputs_ready(self) -> None:
        """The decode reads what the text frontend queued on the render stream (prompt tensors)."""
        if self.on:
            self.decode.wait_stream(self.render)
