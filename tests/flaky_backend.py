"""A test backend: the real Piper voice, except that marked texts fail or kill the worker.

Marks are read from the environment, so a rerun can change what fails:
  CONVTTS_TEST_FAIL_WORD   a text holding this word raises SynthesisError
  CONVTTS_TEST_CRASH_WORD  a text holding this word kills the worker with SIGSEGV
"""

import os
import signal

from convtts.speak.base import SynthesisError
from convtts.speak.piper import PiperBackend, check


class FlakyPiper(PiperBackend):
    name = "piper"
    check = staticmethod(check)

    def synthesize(self, text, speaker, seed):
        fail, crash = os.environ.get("CONVTTS_TEST_FAIL_WORD"), os.environ.get("CONVTTS_TEST_CRASH_WORD")
        if crash and crash in text:
            os.kill(os.getpid(), signal.SIGSEGV)
        if fail and fail in text:
            raise SynthesisError(f"refusing text with {fail!r} (test)")
        return super().synthesize(text, speaker, seed)
