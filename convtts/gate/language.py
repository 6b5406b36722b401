"""A segment's language for the gate, when its plan row does not carry one, by py3langid's model from its wheel.

Chosen over lingua-language-detector and the word tests it replaces, on 40 short technical English
sentences and 22 in other languages (tests/data/language_sentences.tsv; `python bench/language_id.py`,
each detector in a fresh process on a 2-core machine shared with other work):

| detector | English called English | others called English | per call | load | peak memory |
|---|---|---|---|---|---|
| py3langid 0.4.0, the 30 languages below | 40/40 | 0/22 | 20 us | 0.6 s | 131 MB |
| py3langid 0.4.0, all its languages | 38/40 | 0/22 | 40 us | 1.2 s | 131 MB |
| lingua 2.1.1, the 30 languages below, preloaded | 38/40 | 0/22 | 705 us | 8.0 s | 771 MB |
| lingua 2.1.1, all languages, preloaded | 36/40 | 0/22 | 1363 us | 14.5 s | 1276 MB |
| lingua 2.1.1, all languages, low accuracy | 26/40 | 0/22 | 232 us | 0.4 s | 69 MB |
| pocketsphinx's dictionary (85% of words in it) | 35/40 | 1/22 | 5 us | | |
| a few common English words (15% of words) | 25/40 | 0/22 | 5 us | | |

Restricting the choice to languages common in chat data keeps English jargon ("Vim macros automate
repetitive edits.") from going to a rare language whose model it happens to fit better.
"""

from __future__ import annotations

import functools
import math

# Languages a chat turn is likely to be in, by ISO 639-1 code: the model chooses among these only.
LANGUAGES = {
    "English": "en", "German": "de", "French": "fr", "Spanish": "es", "Italian": "it", "Portuguese": "pt",
    "Dutch": "nl", "Polish": "pl", "Russian": "ru", "Ukrainian": "uk", "Chinese": "zh", "Japanese": "ja",
    "Korean": "ko", "Arabic": "ar", "Turkish": "tr", "Vietnamese": "vi", "Indonesian": "id", "Hindi": "hi",
    "Swedish": "sv", "Czech": "cs", "Danish": "da", "Bokmal": "no", "Finnish": "fi", "Hungarian": "hu",
    "Romanian": "ro", "Slovak": "sk", "Croatian": "hr", "Catalan": "ca", "Greek": "el", "Hebrew": "he",
}  # fmt: skip


@functools.cache
def _identifier():
    """Loaded once per process, on first use (0.4 s: the model is decompressed)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    identifier.set_languages(list(LANGUAGES.values()))
    return identifier


def language_of(text: str) -> str:
    """The ISO 639-1 code of the text's most likely language among LANGUAGES."""
    return _identifier().classify(text)[0]


# Languages written without spaces between words: the plan cuts and times their segments, and the gate
# scores their takes, by characters, not words.
CHARACTER_LANGUAGES = frozenset({"zh", "ja", "ko", "yue"})


def is_english(text: str) -> bool:
    return language_of(text) == "en"


def english_share(text: str) -> float:
    """English's share of the model's probability over LANGUAGES (its scores are log-probabilities)."""
    scores = dict(_identifier().rank(text))
    top = max(scores.values())
    return math.exp(scores["en"] - top) / sum(math.exp(s - top) for s in scores.values())
