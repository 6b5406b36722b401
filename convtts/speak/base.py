"""The small interface every TTS backend implements."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class SynthesisError(RuntimeError):
    """One utterance could not be synthesised; the worker records it and moves on."""


class OutOfMemory(SynthesisError):
    """The device ran out of memory: the worker rebuilds the model (or halves its rows) and retries."""


def is_out_of_memory(exc: BaseException) -> bool:
    """The one out-of-memory test of the whole package: CUDA's error, ours, or their text.

    By name and text, so that asking never imports torch (a Piper worker has no reason to).
    """
    if isinstance(exc, OutOfMemory) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return "out of memory" in text.lower() or "ALLOC_FAILED" in text


# What a batched backend's feed may yield in place of an item: nothing now, ask again after the next step
# (a worker holding its first batch, run/batching.py). Only a backend with `feed_may_wait` set is given it.
FEED_WAIT = object()


class Backend(Protocol):
    """A loaded voice model inside one worker process.

    Built once per worker (and again at every rebuild); `synthesize` is called once per utterance.
    """

    name: str  # written to the manifest's `backend` field
    sample_rate: int

    def synthesize(self, text: str, speaker: str, seed: int) -> np.ndarray:
        """Return mono float32 samples in [-1, 1] for `text` spoken by `speaker`.

        `seed` makes the utterance reproducible whatever happened before it in the process.
        """
        ...

    def close(self) -> None:
        """Drop every reference to the model so its memory can be reclaimed."""
        ...
