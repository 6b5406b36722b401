"""A test backend: the real CosyVoice backend whose first batched decode step in each process breaks.

It stands for a fault no single utterance owns (a kernel error in the shared step): the worker
must speak that batch's utterances one at a time and lose none of them.
"""

from convtts.speak.cosyvoice.backend import CosyVoiceBackend
from convtts.speak.cosyvoice.engine.engine import BatchEngine
from convtts.speak.cosyvoice.voice_check import check

_broken = {"done": False}


class BreaksOnce(BatchEngine):
    def _step(self):
        if not _broken["done"] and len(self.rows) > 1:
            _broken["done"] = True
            raise RuntimeError("shared decode step broke (test)")
        return super()._step()


class BrokenBatchCosyVoice(CosyVoiceBackend):
    check = staticmethod(check)

    def _engine(self):
        engine = super()._engine()
        if engine is None:
            return None
        # the same engine, built as the backend built it (its precision cast the model's LLM already)
        return BreaksOnce(self.model, engine.max_rows, engine.precision, engine.options, self.cosy)
