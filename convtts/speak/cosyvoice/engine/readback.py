"""The tokens of a GPU decode step, copied to the host without making the GPU wait."""
from __future__ import annotations

import torch

DEPTH = 4  # copies that may be under way at once (the engine keeps two)


class TokenReadback:
    """Round-robin pinned buffers: a step's [tokens fed in, tokens drawn] copied asynchronously, an event to wait on."""

    def __init__(self, rows: int, device: torch.device):
        self.cuda = device.type == "cuda"
        self.buffers = [torch.zeros(2, rows, dtype=torch.long, pin_memory=self.cuda) for _ in range(DEPTH)]
        self.next = 0

    def start(self, io: torch.Tensor, rows: int):
        """Queue the copy of io[:, :rows] (after the step that fills it); returns what wait() takes."""
        buffer = self.buffers[self.next]
        self.next = (self.next + 1) % DEPTH
        buffer[:, :rows].copy_(io[:, :rows], non_blocking=self.cuda)
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        return buffer, event, rows

    @staticmethod
    def wait(pending) -> tuple[list[int], list[int]]:
        """(tokens fed in, tokens drawn) per slot, once the copy is done."""
        buffer, event, rows = pending
        if event is not None:
            event.synchronize()
        fed, drawn = buffer[:, :rows].tolist()
        return fed, drawn
