"""A test backend that is not CPU-bound: every utterance takes a fixed wall time and comes back as a tone.

With Piper each worker needs a core of its own, so on a 2-core machine four workers cannot run four
times as fast. This voice waits instead of computing, like a worker whose GPU does the work, so
the speed-up from more workers can be measured anywhere. The audio is real: a sine at a pitch per
speaker, as long as the text would take at text.words_per_minute.

  CONVTTS_TEST_UTTERANCE_SECONDS   wall time per utterance (default 0.3)
"""
import os
import time

import numpy as np


class PacedTone:
    name = "paced-tone"
    sample_rate = 16000

    def __init__(self, config):
        self.seconds = float(os.environ.get("CONVTTS_TEST_UTTERANCE_SECONDS", "0.3"))
        self.words_per_second = config.text.words_per_minute / 60
        self.pitch = {voice: 180.0 + 40.0 * i for i, voice in enumerate(config.speakers.voices)}

    def synthesize(self, text, speaker, seed):
        time.sleep(self.seconds)
        length = max(len(text.split()), 1) / self.words_per_second
        t = np.arange(int(length * self.sample_rate)) / self.sample_rate
        return (0.2 * np.sin(2 * np.pi * self.pitch.get(speaker, 220.0) * t)).astype(np.float32)

    def close(self):
        pass
