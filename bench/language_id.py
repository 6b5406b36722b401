#!/usr/bin/env python3
"""Which language identifier the quality gate uses: accuracy on short technical English and speed per call.

Reads tests/data/language_sentences.tsv (English technical sentences and others) and asks each
candidate whether a sentence is English; prints errors, load time, microseconds per call and peak
memory, each candidate in a process of its own.

    pip install lingua-language-detector==2.1.1 py3langid==0.4.0   # the candidates
    python bench/language_id.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from convtts.language import LANGUAGES

SENTENCES = Path(__file__).resolve().parents[1] / "tests" / "data" / "language_sentences.tsv"


def read_sentences() -> list[tuple[str, str]]:
    rows = [line.split("\t", 1) for line in SENTENCES.read_text().splitlines() if line and not line.startswith("#")]
    return [(lang, text) for lang, text in rows]


def lingua_all():
    from lingua import Language, LanguageDetectorBuilder

    detector = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models().build()
    return lambda text: detector.detect_language_of(text) == Language.ENGLISH


def lingua_low_accuracy():
    from lingua import Language, LanguageDetectorBuilder

    detector = LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().build()
    return lambda text: detector.detect_language_of(text) == Language.ENGLISH


def lingua_common():
    from lingua import Language, LanguageDetectorBuilder

    languages = [getattr(Language, name.upper()) for name in COMMON]
    detector = LanguageDetectorBuilder.from_languages(*languages).with_preloaded_language_models().build()
    return lambda text: detector.detect_language_of(text) == Language.ENGLISH


def py3langid_all():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    return lambda text: identifier.classify(text)[0] == "en"


def py3langid_common():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    identifier.set_languages(list(COMMON.values()))
    return lambda text: identifier.classify(text)[0] == "en"


# convtts/language.py's languages, by lingua's name and ISO 639-1 code.
COMMON = {name.lower(): code for name, code in LANGUAGES.items()}


def measure(name: str, factory, rows: list[tuple[str, str]]) -> None:
    started = time.perf_counter()
    is_english = factory()
    is_english("warm up")
    loaded = time.perf_counter() - started
    missed = [t for lang, t in rows if lang == "en" and not is_english(t)]
    wrong = [t for lang, t in rows if lang != "en" and is_english(t)]
    started = time.perf_counter()
    for _ in range(5):
        for _, text in rows:
            is_english(text)
    per_call = (time.perf_counter() - started) / (5 * len(rows)) * 1e6
    english = sum(lang == "en" for lang, _ in rows)
    print(
        f"{name:22} English kept {english - len(missed)}/{english}, others called English {len(wrong)}/"
        f"{len(rows) - english}, load {loaded:.2f}s, {per_call:.0f} us a call"
    )
    for text in missed + wrong:
        print(f"    wrong: {text}")


CANDIDATES = {
    "lingua-all": lingua_all,
    "lingua-low-accuracy": lingua_low_accuracy,
    "lingua-common": lingua_common,
    "py3langid-all": py3langid_all,
    "py3langid-common": py3langid_common,
}


def main() -> None:
    """Each candidate in a process of its own, so that its load time and memory are its own."""
    if len(sys.argv) > 1:
        measure(sys.argv[1], CANDIDATES[sys.argv[1]], read_sentences())
        print(f"{'':22} peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")
        return
    for name in CANDIDATES:
        subprocess.run([sys.executable, __file__, name], check=True)


if __name__ == "__main__":
    main()
