"""How a failure inside the CosyVoice runtime reaches the worker: the errors upstream's own threads
raise caught, an out-of-memory told apart from other failures, and the frame that raised named.
Apart from backend.py: upstream's one-at-a-time path, the batched engine's results and the text
frontend's fallback all report through these.
"""

from __future__ import annotations

import logging
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path

from convtts.speak.base import OutOfMemory

log = logging.getLogger(__name__)


@contextmanager
def thread_errors():
    """Collect exceptions raised in threads started meanwhile.

    Upstream decodes speech tokens in a thread; when that thread raises (CUDA out of memory, a
    sampling failure), the caller still gets audio for the tokens decoded so far and no error.
    """
    caught: list[BaseException] = []
    previous = threading.excepthook

    def hook(args):
        caught.append(args.exc_value)
        log.debug("exception in upstream thread %s", args.thread, exc_info=args.exc_value)

    threading.excepthook = hook
    try:
        yield caught
    finally:
        threading.excepthook = previous


def out_of_memory(exc: BaseException) -> OutOfMemory:
    """Ours for an out-of-memory error of torch or the runtime: its own text where that names it already,
    so a log line's first sentence says it once."""
    text = str(exc)
    return OutOfMemory(text if "out of memory" in text.lower() else f"CUDA out of memory: {text}")


def raised_at(error: BaseException) -> str:
    """' (at file.py:line in function)': the innermost frame that raised `error`, so that a failure
    in the runtime's text frontend or model names its place in the manifest and the log."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ is not None else []
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"
