"""A benchmarking voice: silence as long as the text would take to say, made at once.

With it, run_all.sh measures the pipeline's own cost (planning, slots, workers, audio writes,
manifests, merge) with no model in the way. The length rule is the plan's own estimate:
`text.words_per_minute` (150 by default, so 0.4 s a word), or for Chinese, Japanese and Korean
text `text.chars_per_minute` (convtts/language.py counts the characters), at least one word's
worth, so that the audio hours of a run equal the plan's `estimated_hours`.
"""

from __future__ import annotations

import numpy as np

from convtts.config import Config, ConfigError, TextConfig
from convtts.language import detect, spoken_units
from convtts.speak.base import Backend


def check(config: Config) -> None:
    """Nothing to load; the rate is checked here so that a bad one stops the run before it starts."""
    rate = config.tts.silence.sample_rate
    if not 8000 <= rate <= 192000:
        raise ConfigError(f"tts.silence.sample_rate must be between 8000 and 192000, got {rate}")


def silence_samples(text: str, rates: TextConfig, sample_rate: int) -> int:
    """Samples of silence for `text`: its words (or characters) at its language's rate, at least one."""
    language = detect(text)
    units = max(spoken_units(text, language), 1)
    return round(rates.seconds(units, language) * sample_rate)


class SilenceBackend(Backend):
    """Returns zeros of the planned length; any speaker name is accepted."""

    name = "silence"
    check = staticmethod(check)

    def __init__(self, config: Config):
        self.sample_rate = config.tts.silence.sample_rate
        self.rates = config.text

    def synthesize(self, text: str, speaker: str, seed: int) -> np.ndarray:
        return np.zeros(silence_samples(text, self.rates, self.sample_rate), dtype=np.float32)
