"""The tokens of a GPU decode step, copied to the host without making the GPU wait."""

from __future__ import annotations

import torch

DEPTH = 4  # copies that may be under way at once (the engine keeps two)


class TokenReadback:
    """Round-robin pinned buffers: a step's [tokens fed in, tokens drawn] copied asynchronously, an event to wait on."""

    def __init__(self, rows: int, device: torch.device):
        self.cuda = device.type == "cuda"
        self.buffers = [torch.zeros(2, rows, dtype=torch.long, pin_memory=self.cuda) for _ in range(DEPTH)]
        self.events = [torch.cuda.Event() if self.cuda else None for _ in range(DEPTH)]
        self.next = 0

    def start(self, io: torch.Tensor, rows: int):
        """Queue the copy of io (after the step that fills it); returns what wait() takes."""
        buffer = self.next
        self.next = (self.next + 1) % DEPTH
        self.buffers[buffer].copy_(io, non_blocking=self.cuda)  # whole and contiguous: a plain asynchronous copy
        if self.events[buffer] is not None:
            self.events[buffer].record()
        return buffer, rows

    def wait(self, pending) -> tuple[list[int], list[int]]:
        """(tokens fed in, tokens drawn) per row of the step, once the copy is done."""
        buffer, rows = pending
        if self.events[buffer] is not None:
            self.events[buffer].synchronize()
        fed, drawn = self.buffers[buffer][:, :rows].tolist()
        return fed, drawn
