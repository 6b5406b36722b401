"""The quality gate's language test: short technical English is English, other languages are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from convtts.config import ConfigError, ValidateConfig
from convtts.language import is_english

SENTENCES = Path(__file__).parent / "data" / "language_sentences.tsv"
ROWS = [line.split("\t", 1) for line in SENTENCES.read_text().splitlines() if line and not line.startswith("#")]


def test_the_table_holds_enough_of_each():
    assert sum(lang == "en" for lang, _ in ROWS) >= 40 and sum(lang != "en" for lang, _ in ROWS) >= 20


@pytest.mark.parametrize("text", [text for lang, text in ROWS if lang == "en"])
def test_technical_english_is_english(text):
    assert is_english(text)


@pytest.mark.parametrize("text", [text for lang, text in ROWS if lang != "en"])
def test_other_languages_are_not_english(text):
    assert not is_english(text)


def test_a_gate_without_the_language_model_stops_before_anything_starts(monkeypatch):
    import importlib.util

    from convtts.gate.recognisers import check_recogniser_installed

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "py3langid" else real(name, *a))
    with pytest.raises(ConfigError, match="needs py3langid"):
        check_recogniser_installed(ValidateConfig(enabled=True))
    check_recogniser_installed(ValidateConfig(enabled=True, assume_english=True))  # no language test: not needed
