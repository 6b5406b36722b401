"""The silence voice, recording every member of it that code outside the voice reads: what the run
stage touches of a backend, for tests/test_backend_contract.py.

  CONVTTS_TEST_TOUCHED   a folder: each process appends `module name` lines to its own file, once each
  CONVTTS_TEST_OOM_ONCE  set: StrictBatchedSilence's first batch in each process runs out of memory
"""

from __future__ import annotations

import os
import sys
from abc import ABCMeta
from pathlib import Path

import numpy as np

from convtts.speak.base import BatchedBackend, OutOfMemory, Resources
from convtts.speak.silence import SilenceBackend

INSIDE = {__name__, "convtts.speak.base", "convtts.speak.silence"}  # the voice's own code
_seen: set[tuple[str, str]] = set()


def touched(name: str) -> None:
    """Record `name` once for the module of the frame that read it, unless the voice read it itself."""
    caller = sys._getframe(2).f_globals.get("__name__", "")
    if not caller.startswith("convtts") or caller in INSIDE or name.startswith("__") or (caller, name) in _seen:
        return
    _seen.add((caller, name))
    with open(Path(os.environ["CONVTTS_TEST_TOUCHED"]) / f"{os.getpid()}.txt", "a") as out:
        out.write(f"{caller} {name}\n")


class Recording(ABCMeta):
    def __getattribute__(cls, name):
        touched(name)
        return super().__getattribute__(name)


class StrictSilence(SilenceBackend, metaclass=Recording):
    def __getattribute__(self, name):
        touched(name)
        return super().__getattribute__(name)


class StrictBatchedSilence(StrictSilence, BatchedBackend):
    """Speaks three at a time; with CONVTTS_TEST_OOM_ONCE its first batch runs out of memory, so
    that the worker halves its rows and grows them again."""

    def __init__(self, config):
        super().__init__(config)
        self.batch_rows = self.built_rows = 3
        self.short_of_memory = bool(os.environ.get("CONVTTS_TEST_OOM_ONCE"))

    @classmethod
    def resources(cls, config, device):
        return Resources(rows=3)

    def synthesize_many(self, items):
        for key, text, speaker, seed in items:
            if self.short_of_memory:
                self.short_of_memory = False
                raise OutOfMemory("CUDA out of memory (scripted)")
            yield key, np.asarray(self.synthesize(text, speaker, seed))

    def shrink_batch(self):
        self.batch_rows = max(1, self.batch_rows // 2)
        return self.batch_rows

    def grow_batch(self):
        self.batch_rows = min(self.built_rows, self.batch_rows * 2)
        return self.batch_rows
