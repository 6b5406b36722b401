"""An utterance in the batched engine (Request) and one text chunk of it in the decode (Row)."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(eq=False)
class Request:
    """One utterance: the caller's key for it, its frontend inputs (one dict per text chunk), its seed."""
    key: object
    chunks: list[dict]
    seed: int
    generator: torch.Generator = None  # this utterance's own random stream (CPU)
    audio: list[np.ndarray] = field(default_factory=list)
    error: BaseException | None = None
    next_chunk: int = 0

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)


@dataclass(eq=False)
class Row:
    """One text chunk in the decode: its cache padding, sampled tokens and bounds."""
    request: Request
    chunk: dict
    min_len: int
    max_len: int
    pad: int = 0
    tokens: list[int] = field(default_factory=list)  # every sampled token (the repetition window)
    kept: list[int] = field(default_factory=list)  # what the flow gets (long silences trimmed)
    silent_run: int = 0


@contextmanager
def own_random_stream(request: Request):
    """Run upstream code that draws from torch's global CPU generator on this request's stream."""
    saved = torch.get_rng_state()
    torch.set_rng_state(request.generator.get_state())
    try:
        yield
    finally:
        request.generator.set_state(torch.get_rng_state())
        torch.set_rng_state(saved)
