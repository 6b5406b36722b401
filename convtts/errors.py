"""The errors a voice raises and the one out-of-memory test, below every stage: the voices and their
engines raise them, the run stage records them, and the gate's recogniser and the CUDA graphs they
share (convtts/cuda_graphs.py) tell an out-of-memory from any other failure."""

from __future__ import annotations


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
