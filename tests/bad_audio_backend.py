"""A test backend: the real Piper voice, except that chosen ids get wrong audio on their first takes.

CONVTTS_TEST_BAD lists `ID=KIND:TAKES` items separated by commas, read in each worker:
  KIND   silence (no voice, a plausible length) | other (another sentence of as many words, spoken)
  TAKES  how many of the id's takes are bad (take 0 is the first); `all` for every take
The backend sees (text, speaker, seed), not the id: it knows an id's takes by their seeds
(quality.take_seed), so a re-speak that reused the seed would stay bad.

BatchedBadAudioPiper speaks through synthesize_many, so that the worker takes its batched path.
"""

import os

import numpy as np

from convtts.gate.quality import take_seed
from convtts.speak.base import BatchedBackend, SynthesisError
from convtts.speak.piper import PiperBackend, check

OTHER_WORDS = (
    "seven purple engines hum quietly beneath the old harbour bridge while gulls circle "
    "over fishing boats and a bell rings twice"
).split()


def bad_seeds(base: int, spec: str) -> dict[int, str]:
    seeds = {}
    for item in filter(None, spec.split(",")):
        uid, _, rest = item.partition("=")
        kind, _, takes = rest.partition(":")
        for take in range(20 if takes == "all" else int(takes or 1)):
            seeds[take_seed(base, uid.strip(), take)] = kind
    return seeds


class BadAudioPiper(PiperBackend):
    name = "piper"
    check = staticmethod(check)

    def __init__(self, config):
        super().__init__(config)
        self.bad = bad_seeds(config.workers.seed, os.environ.get("CONVTTS_TEST_BAD", ""))

    def synthesize(self, text, speaker, seed):
        kind = self.bad.get(seed)
        words = len(text.split())
        if kind == "silence":
            return np.zeros(int(self.sample_rate * 0.4 * words), dtype=np.float32)
        if kind == "other":
            other = " ".join(OTHER_WORDS[i % len(OTHER_WORDS)] for i in range(words))
            return super().synthesize(other, speaker, seed)
        return super().synthesize(text, speaker, seed)


class BatchedBadAudioPiper(BadAudioPiper, BatchedBackend):
    batch_rows = 3

    def synthesize(self, text, speaker, seed):
        raise SynthesisError("spoken one at a time: the worker did not take the batched path (test)")

    def synthesize_many(self, items):
        for key, text, speaker, seed in items:
            try:
                yield key, BadAudioPiper.synthesize(self, text, speaker, seed)
            except Exception as exc:  # this utterance's, as the batched backends report it
                yield key, exc

    def shrink_batch(self):
        return self.batch_rows

    def grow_batch(self):
        return self.batch_rows
