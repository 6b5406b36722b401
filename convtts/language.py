"""A text's language (ISO 639-1): by its script where that decides, by py3langid where not; for the plan
(a turn's language and its units), the silence voice (its length) and the gate (whether a take is English).

The script test comes first because it is nearly free and settles the cases a voice must not get
wrong: text written mostly in Han characters, kana or Hangul is Chinese, Japanese or Korean. Text
of ASCII letters is English when it is short or holds one of English's commonest words (the words
test costs about a microsecond); only the rest, and text with other letters (accents, Cyrillic,
Arabic ...), goes to py3langid, on its first PROBE_CHARS characters.
Without py3langid installed, ASCII text is English and other text is named by its script.

Measured on a 2-core machine shared with other work (plan_conversation per turn, text.language
auto against a fixed language): 1.8 us more on LLaVA-1.5's short turns (30.9 against 29.1), 2.7 on
LLaVA-Instruct's answers (44.6 against 41.9), 12 on Chinese paragraphs (56.9 against 44.5).

A mixed turn is one turn in the language of its majority: Chinese characters are counted against
Latin words, not letters, since one character is about one word's worth of speech ("计算句子
"I want to go for a walk"中的单词数。": 9 characters, 7 words: Chinese).

py3langid (its model is in its wheel) was chosen over lingua-language-detector and the word tests it
replaced, on 40 short technical English sentences and 22 in other languages
(tests/data/language_sentences.tsv; `python bench/language_id.py`, each detector in a fresh process on
a 2-core machine shared with other work):

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
import importlib.util
import math
import re

# Languages written without spaces between words: the plan cuts and times their segments, and the gate
# scores their takes, by characters, not words.
CHARACTER_LANGUAGES = frozenset({"zh", "ja", "ko", "yue"})

PROBE_CHARS = 300  # py3langid's cost grows with the text; a turn's start tells its language
MIN_MODEL_WORDS = 4  # ASCII text of fewer words is English without asking py3langid
MIN_ENGLISH_SHARE = 0.01  # ASCII text is English unless py3langid gives English less than this
# Words nearly every English turn of a few words holds, and other languages written in ASCII rarely.
_ENGLISH_WORD = re.compile(r"\b(?:the|and|you|your|what|how|this|that|with|are|can|does|which|there|it|of)\b", re.I)

_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
_KANA = "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f"
_HANGUL = "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"
_CJK = re.compile(f"[{_HAN}{_KANA}{_HANGUL}]")
_KANA_CHAR = re.compile(f"[{_KANA}]")
_HANGUL_CHAR = re.compile(f"[{_HANGUL}]")
_LATIN_WORD = re.compile(r"[A-Za-z\u00c0-\u024f]+")
_NON_ASCII_LETTER = re.compile(r"[^\x00-\x7f]")
# Scripts that name their language well enough when py3langid is not there.
_SCRIPTS = (
    (re.compile("[\u0400-\u04ff]"), "ru"),
    (re.compile("[\u0600-\u06ff]"), "ar"),
    (re.compile("[\u0370-\u03ff]"), "el"),
    (re.compile("[\u0590-\u05ff]"), "he"),
    (re.compile("[\u0900-\u097f]"), "hi"),
    (re.compile("[\u0e00-\u0e7f]"), "th"),
)


def detect(text: str) -> str:
    """The language of a turn, by ISO 639-1 code."""
    if text.isascii():
        return _ascii_language(text)
    cjk = len(_CJK.findall(text))
    if cjk and cjk >= len(_LATIN_WORD.findall(text)):
        return _cjk_language(text, cjk)
    if not any(ch.isalpha() for ch in _NON_ASCII_LETTER.findall(text)):
        return "en"  # ASCII letters with curly quotes, dashes, symbols
    return _by_model(text[:PROBE_CHARS])


def _ascii_language(text: str) -> str:
    """English, unless a turn of several words has none of English's commonest words and py3langid
    finds English all but impossible ("Quelle est la meilleure saison pour visiter Paris ?": 0.000).
    A short answer ("No", "Dakota digital") is English: too few words for a model to tell; so is a
    doubtful one ("No coal no nuclear": Spanish 0.76, English 0.07; LaTeX, English 0.36)."""
    probe = text[:PROBE_CHARS]
    if probe.count(" ") < MIN_MODEL_WORDS - 1 or _ENGLISH_WORD.search(probe) or not _HAVE_MODEL:
        return "en"
    return "en" if english_share(probe) >= MIN_ENGLISH_SHARE else language_of(probe)


def _cjk_language(text: str, cjk: int) -> str:
    """Kana mark Japanese (its kanji are Han characters), Hangul Korean; Han alone is Chinese."""
    kana = len(_KANA_CHAR.findall(text))
    hangul = len(_HANGUL_CHAR.findall(text))
    if hangul * 2 > cjk:
        return "ko"
    if kana * 10 >= cjk:  # Japanese prose is a third or more kana; a stray katakana name is not
        return "ja"
    return "zh"


def _by_model(text: str) -> str:
    if _HAVE_MODEL:
        return language_of(text)
    for script, language in _SCRIPTS:
        if script.search(text):
            return language
    return "en"


_HAVE_MODEL = importlib.util.find_spec("py3langid") is not None


def counts_characters(language: str) -> bool:
    """Whether the language's segments and speaking rate are measured in characters."""
    return language in CHARACTER_LANGUAGES


# One unit: a CJK character, or a run of other letters and digits (an embedded English word, a number).
_UNIT = re.compile(f"[{_HAN}{_KANA}{_HANGUL}]|[^\\W_{_HAN}{_KANA}{_HANGUL}]+")


def spoken_units(text: str, language: str) -> int:
    """Words; for CJK languages, characters, with an embedded word or number as one."""
    if counts_characters(language):
        return len(_UNIT.findall(text))
    return text.count(" ") + 1 if text else 0  # segments hold single spaces (textclean.split_segments)


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


def is_english(text: str) -> bool:
    return language_of(text) == "en"


def english_share(text: str) -> float:
    """English's share of the model's probability over LANGUAGES (its scores are log-probabilities)."""
    scores = dict(_identifier().rank(text))
    top = max(scores.values())
    return math.exp(scores["en"] - top) / sum(math.exp(s - top) for s in scores.values())
