"""An utterance in the batched engine (Request) and one text chunk of it in the decode (Sequence)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from convtts.speak.base import SynthesisError

# A sequence's life: waiting for a row, running (decoding in a row), decoded (its tokens wait for
# the flow), done (spoken), failed (its request has an error).
WAITING, RUNNING, DECODED, DONE, FAILED = "waiting", "running", "decoded", "done", "failed"


class EndlessDecode(SynthesisError):
    """A chunk decoded up to its length bound without drawing an end token (upstream's
    max_token_text_ratio); its utterance fails, unrendered: such a take is babble or silence of about
    ten times the text's length, never the text."""


@dataclass(eq=False)
class Request:
    """One utterance: the caller's key for it, its frontend inputs (one dict per text chunk), its seed.

    `pending` is the text frontend still at work on it (a Future of the chunk list), if any.
    """

    key: object
    chunks: list[dict]
    seed: int
    generator: torch.Generator = None  # this utterance's own random stream (CPU)
    audio: list[np.ndarray] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)  # the speech tokens each chunk decoded, as the flow got them
    error: BaseException | None = None
    next_chunk: int = 0
    open: int = 0  # chunks taken into the decode and not yet through the flow
    pending: object = None

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)

    def ready(self) -> bool:
        return self.pending is None or self.pending.done()

    def resolve(self) -> None:
        """Take the frontend's result (waiting for it if need be): the chunks, or the error."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        try:
            self.chunks = pending.result()
        except Exception as exc:  # the frontend refused this text: this utterance only
            self.error = exc


@dataclass(eq=False)
class Sequence:
    """One text chunk of a request in the decode: its status, row, sampled tokens and bounds."""

    request: Request
    chunk: dict
    index: int  # which chunk of the request
    min_len: int
    max_len: int
    status: str = WAITING
    row: int = -1  # its row of a static cache
    prompt_len: int = 0  # cache positions its prefill filled
    launched: int = 0  # decode steps started for it (the cache holds prompt_len + launched positions)
    pad: int = 0  # left padding in the upstream path's shared cache
    tokens: list[int] = field(default_factory=list)  # every sampled token (the repetition window)
    kept: list[int] = field(default_factory=list)  # what the flow gets (long silences trimmed)
    silent_run: int = 0
    started: bool = False  # its first token (drawn at the prefill) has been read
    stream: Request | ChunkStream = None  # where its random numbers come from: the request's, or its own

    def __post_init__(self):
        self.stream = self.stream or self.request


Row = Sequence  # the flow's name for a decoded sequence


@dataclass(eq=False)
class ChunkStream:
    """The random stream of a chunk decoded beside its request's others (a seed and a CPU generator, as
    a Request has): its draws do not depend on when its sibling chunks draw theirs."""

    seed: int
    generator: torch.Generator = None

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)

    @classmethod
    def of(cls, request: Request, index: int) -> ChunkStream:
        return cls(chunk_seed(request.seed, index))


MASK64 = (1 << 64) - 1


def chunk_seed(seed: int, index: int) -> int:
    """A seed for chunk `index` of an utterance of `seed` (splitmix64's finaliser over both), 63 bits."""
    x = (seed + 0x9E3779B97F4A7C15 * (index + 1)) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) >> 1


def place(parts: list, index: int, value) -> None:
    """parts[index] = value, the list grown with None up to it: a request's chunks may finish in any order."""
    parts.extend([None] * (index + 1 - len(parts)))
    parts[index] = value


@contextmanager
def own_random_stream(stream: Request | ChunkStream):
    """Run upstream code that draws from torch's global CPU generator on this request's (or chunk's) stream."""
    saved = torch.get_rng_state()
    torch.set_rng_state(stream.generator.get_state())
    try:
        yield
    finally:
        stream.generator.set_state(torch.get_rng_state())
        torch.set_rng_state(saved)


Stream = Request | ChunkStream  # what draws random numbers: a seed and a CPU generator
