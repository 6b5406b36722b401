"""A test backend that is not CPU-bound: every utterance takes a fixed wall time and comes back as a tone.

With Piper each worker needs a core of its own, so on a 2-core machine four workers cannot run four
times as fast. This voice waits instead of computing, like a worker whose GPU does the work, so
the speed-up from more workers can be measured anywhere. The audio is real: a sine at a pitch per
speaker, as long as the text would take at text.words_per_minute.

  CONVTTS_TEST_UTTERANCE_SECONDS   wall time per utterance (default 0.3)
  CONVTTS_TEST_SLOW_WORKER         the worker (process name, e.g. slot0-w0) that takes
  CONVTTS_TEST_SLOW_FACTOR         this many times longer (default 1: none)
  CONVTTS_TEST_ROWS                PacedBatchTone: utterances decoded at once (default 4)
  CONVTTS_TEST_LOAD_SECONDS        wall time of a model load (default 0)
  CONVTTS_TEST_LOAD_DIES           set: every model load kills its worker (SIGKILL), as an out-of-memory kill would
"""

import multiprocessing
import os
import signal
import time

import numpy as np

from convtts.speak.base import FEED_WAIT, Backend, BatchedBackend, Resources


class PacedTone(Backend):
    name = "paced-tone"
    sample_rate = 16000

    def __init__(self, config):
        time.sleep(float(os.environ.get("CONVTTS_TEST_LOAD_SECONDS", "0")))
        if os.environ.get("CONVTTS_TEST_LOAD_DIES"):
            os.kill(os.getpid(), signal.SIGKILL)
        self.seconds = float(os.environ.get("CONVTTS_TEST_UTTERANCE_SECONDS", "0.3"))
        if multiprocessing.current_process().name == os.environ.get("CONVTTS_TEST_SLOW_WORKER"):
            self.seconds *= float(os.environ.get("CONVTTS_TEST_SLOW_FACTOR", "1"))
        self.words_per_second = config.text.words_per_minute / 60
        self.pitch = {voice: 180.0 + 40.0 * i for i, voice in enumerate(config.speakers.voices)}

    def synthesize(self, text, speaker, seed):
        time.sleep(self.seconds)
        return self.tone(text, speaker)

    def tone(self, text, speaker):
        length = max(len(text.split()), 1) / self.words_per_second
        t = np.arange(int(length * self.sample_rate)) / self.sample_rate
        return (0.2 * np.sin(2 * np.pi * self.pitch.get(speaker, 220.0) * t)).astype(np.float32)

    def close(self):
        pass


class PacedBatchTone(PacedTone, BatchedBackend):
    """The same voice with a batched path run like the CosyVoice engines: up to `batch_rows`
    utterances at once, a new one read from `items` as soon as a row frees, each taking the
    utterance time per ten words from when its row took it."""

    name = "paced-batch-tone"
    feed_may_wait = True  # its feed may say FEED_WAIT, as the CosyVoice engine's may

    def __init__(self, config):
        super().__init__(config)
        self.batch_rows = self.built_rows = self.resources(config, "cpu").rows

    @classmethod
    def resources(cls, config, device):
        return Resources(rows=int(os.environ.get("CONVTTS_TEST_ROWS", "4")))

    def shrink_batch(self):
        self.batch_rows = max(1, self.batch_rows // 2)
        return self.batch_rows

    def grow_batch(self):
        self.batch_rows = min(self.built_rows, self.batch_rows * 2)
        return self.batch_rows

    def synthesize_many(self, items):
        source, rows = iter(items), []  # rows: (ends at, key, text, speaker)
        while True:
            while len(rows) < self.batch_rows:
                item = next(source, None)
                if item is None or item is FEED_WAIT:  # none now: asked again once a row has ended
                    break
                key, text, speaker, _ = item  # longer texts take longer, so rows end at different times
                rows.append((time.time() + self.seconds * max(len(text.split()), 1) / 10, key, text, speaker))
            if not rows:
                return
            rows.sort(key=lambda row: row[0])
            ends, key, text, speaker = rows.pop(0)
            time.sleep(max(0.0, ends - time.time()))
            yield key, self.tone(text, speaker)
