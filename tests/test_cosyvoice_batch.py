"""The batched CosyVoice engine against upstream's own one-at-a-time path, on a tiny random v1 model (CPU)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_short_of_memory, speak_with_two_refused
from convtts.speak.base import OutOfMemory
from convtts.speak.cosyvoice.backend import CosyVoiceBackend
from convtts.speak.cosyvoice.engine.engine import BatchEngine
from convtts.config import Config, CosyVoiceConfig, SpeakerConfig, TTSConfig
from convtts.testing.cosyvoice_model import build_model_dir
from convtts.testing.cosyvoice_v1 import expected_samples, text_token_counts

RATIO = 4  # speech tokens per text token
VOICES = ("英文女", "英文男")
TEXTS = [
    "The weather was lovely this morning.",
    "We walked to the harbour and watched the boats come in, one after another, until the sun went down.",
    "A cat sat on the mat.",
    "It weighs 3.5 kilograms and costs twelve dollars.",
    "Yes.",
    "The second sentence is here. And a third one follows it, a little longer than the others.",
]
# Rows of one flow pass are padded to the longest, and the flow estimator's group norms take
# their statistics over the padded frames too: a row alone in its pass matches the solo
# rendering to 1e-7, a padded one deviates up to 1.1e-2 of full scale on these tiny models.
TOLERANCE = 2e-2


def config(model_dir, batch_size: int) -> Config:
    cosy = CosyVoiceConfig(model_dir=str(model_dir), batch_size=batch_size)
    return Config(speakers=SpeakerConfig(voices=VOICES, policy="single"), tts=TTSConfig(backend="cosyvoice", cosyvoice=cosy))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("cvb") / "tiny", "tiny", VOICES, tokens_per_text_token=RATIO)


@pytest.fixture(scope="module")
def solo(model_dir):
    backend = CosyVoiceBackend(config(model_dir, 1))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def batched(model_dir):
    backend = CosyVoiceBackend(config(model_dir, 4))
    yield backend
    backend.close()


def items(texts=TEXTS, speaker="英文女"):
    return [(i, text, speaker, 1000 + i) for i, text in enumerate(texts)]


def test_a_batch_of_one_is_the_unbatched_path_sample_for_sample(solo):
    solo.engine = BatchEngine(solo.model, 1)
    try:
        results = dict(solo.synthesize_many(items()))
    finally:
        solo.engine = None
    for i, text in enumerate(TEXTS):
        np.testing.assert_array_equal(results[i], solo.synthesize(text, "英文女", 1000 + i))


def test_a_batch_speaks_each_utterance_as_it_would_alone(solo, batched):
    assert batched.batch_rows == 4  # six utterances through four rows: rows are refilled as others finish
    results = dict(batched.synthesize_many(items()))
    assert sorted(results) == list(range(len(TEXTS)))
    for i, text in enumerate(TEXTS):
        audio = results[i]
        assert len(audio) == expected_samples(text_token_counts(batched.model.frontend, text), RATIO), text
        assert np.abs(audio - solo.synthesize(text, "英文女", 1000 + i)).max() < TOLERANCE, text


def test_each_utterance_has_its_own_seed(batched):
    twice = dict(batched.synthesize_many([(0, TEXTS[0], "英文女", 7), (1, TEXTS[0], "英文女", 8), (2, TEXTS[0], "英文女", 7)]))
    assert np.abs(twice[0] - twice[2]).max() < TOLERANCE
    assert np.abs(twice[0] - twice[1]).max() > 0.01


def test_one_failing_utterance_fails_alone(solo, batched):
    results = speak_with_two_refused(batched, TEXTS, "英文女")
    for i in (0, 1, 3, 5):
        assert np.abs(results[i] - solo.synthesize(TEXTS[i], "英文女", 1000 + i)).max() < TOLERANCE


def test_out_of_memory_leaves_the_unfinished_to_the_caller(batched, monkeypatch):
    run_short_of_memory(monkeypatch, BatchEngine, rows=2)
    given = []

    def feed():
        for item in items():
            given.append(item[0])
            yield item

    finished = {}
    with pytest.raises(OutOfMemory):
        for key, audio in batched.synthesize_many(feed()):
            finished[key] = audio
    assert len(given) >= 3 and not finished  # handed over, none finished: all the caller's to retry
    assert batched.shrink_batch() == 2
    finished = dict(batched.synthesize_many(items()))  # two rows fit
    assert sorted(finished) == list(range(len(TEXTS)))
    batched.engine.max_rows = 4


def test_batch_size_is_checked_up_front():
    from convtts.config import ConfigError, load_config

    assert load_config(None, ["tts.cosyvoice.batch_size=16"]).tts.cosyvoice.batch_size == 16
    assert load_config(None, ["tts.cosyvoice.batch_size=0"]).tts.cosyvoice.batch_size == 0  # automatic
    for bad in ("-1", "257", "two"):
        with pytest.raises(ConfigError, match="batch_size"):
            load_config(None, [f"tts.cosyvoice.batch_size={bad}"])
