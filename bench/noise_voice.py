"""A bench voice that costs nothing to run and whose audio does not compress: seeded noise under a tone.

Real speech barely compresses, and export formats that compress or deduplicate (parquet) would look
far faster on the repository's test tone, whose clips of one length are identical. 22050 Hz like the
default Piper voice, as long as the text would take at text.words_per_minute.
"""

import numpy as np


class NoiseVoice:
    name = "noise-voice"
    sample_rate = 22050

    def __init__(self, config):
        self.words_per_second = config.text.words_per_minute / 60

    def synthesize(self, text, speaker, seed):
        length = int(max(len(text.split()), 1) / self.words_per_second * self.sample_rate)
        rng = np.random.default_rng(seed)
        t = np.arange(length) / self.sample_rate
        return (0.2 * np.sin(2 * np.pi * 200.0 * t) + 0.05 * rng.standard_normal(length)).astype(np.float32)
