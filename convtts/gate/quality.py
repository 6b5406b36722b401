"""The quality gate: score each take (length per word, silence, clipping, an ASR round trip) before it is written.

A take that fails a check raises QualityFailure naming the check and its figure, e.g. `wer 0.83 > 0.6`;
the caller speaks the utterance again with the next take's seed (take_seed) up to
validate.max_respeaks times, then records the failure. Errors (exceptions, crashes) are counted apart,
by workers.max_attempts.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np

from convtts.config import ConfigError, ValidateConfig

log = logging.getLogger(__name__)

ASR_RATE = 16000  # every recogniser here takes 16 kHz mono


def take_seed(base: int, uid: str, take: int) -> int:
    """The seed of an utterance's take: take 0 is the id's own seed, each re-speak a new one, all from the id."""
    key = f"{base}:{uid}" if take == 0 else f"{base}:{uid}:take{take}"
    digest = hashlib.blake2b(key.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class QualityFailure(Exception):
    """A take that a check refused; not an error: it is re-spoken, not retried."""

    def __init__(self, check: str, figure: float, limit: float, scores: dict):
        self.check, self.figure, self.limit, self.scores = check, figure, limit, scores
        sign = "<" if check.startswith("short") else ">"
        super().__init__(f"{check} {figure:.3g} {sign} {limit:g}")


# -- text: what the recogniser should hear --------------------------------------------------------

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
_CURRENCY = {"$": "dollars", "€": "euros", "£": "pounds"}
_MONEY = re.compile(r"([$€£])\s?(\d[\d,]*(?:\.\d+)?)")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_SYMBOLS = {"%": " percent ", "&": " and ", "°": " degrees ", "+": " plus ", "=": " equals ", "@": " at "}
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
# Words frequent in English and rare as words of the other languages with Latin letters.
_ENGLISH = frozenset(
    "the and is are of to with you your that this it its for be have has what which there they he she we not "
    "can will at by from or how does were their these those would should could".split()
)


def number_words(n: int) -> list[str]:
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])
    for value, name in _SCALES:
        if n >= value:
            rest = n % value
            return number_words(n // value) + [name] + (number_words(rest) if rest else [])
    raise AssertionError(n)


def _spell_number(match: re.Match) -> str:
    whole, _, decimals = match.group(0).replace(",", "").partition(".")
    if len(whole) > 15:
        return " ".join(_ONES[int(d)] for d in whole)
    words = number_words(int(whole)) + (["point"] + [_ONES[int(d)] for d in decimals] if decimals else [])
    return f" {' '.join(words)} "


def spoken_words(text: str) -> list[str]:
    """The words a listener hears, lower case: `It costs $12.50, 20% off` -> it costs twelve point five zero dollars twenty percent off."""
    text = _MONEY.sub(lambda m: f"{m.group(2)} {_CURRENCY[m.group(1)]}", text.lower().replace("’", "'"))
    text = _NUMBER.sub(_spell_number, text)
    for symbol, word in _SYMBOLS.items():
        text = text.replace(symbol, word)
    text = _CJK.sub(lambda m: f" {m.group(0)} ", text)  # no spaces between CJK words: count characters
    return _WORD.findall(text)


def looks_english(text: str, lexicon: frozenset | None = None) -> bool:
    """Whether the recognisers, run in English, can be asked to hear this text (numbers aside).

    Latin letters, and either all but 15% of the words (or all but one) in `lexicon`, the
    recogniser's English pronouncing dictionary (French, German or Spanish text scores 50-75%
    there, English 90-100%), or, without one, 15% of the words among a few common English words.
    """
    words = [w for w in _WORD.findall(text.lower()) if not w.isdigit()]
    letters = "".join(words)
    if not letters or sum(c.isascii() for c in letters) < 0.9 * len(letters):
        return False
    if lexicon:
        return sum(w not in lexicon for w in words) <= max(1.0, 0.15 * len(words))
    return sum(w in _ENGLISH for w in words) >= 0.15 * len(words)


def english_lexicon() -> frozenset | None:
    """The words of pocketsphinx's US English dictionary (126,000), or None where it is not installed."""
    try:
        from pocketsphinx import get_model_path
    except ImportError:
        return None
    path = os.path.join(get_model_path(), "en-us", "cmudict-en-us.dict")
    with open(path, encoding="utf-8", errors="replace") as lines:
        return frozenset(line.split(" ", 1)[0].split("(", 1)[0] for line in lines)


def word_error_rate(reference: list[str], heard: list[str]) -> float:
    """(substitutions + deletions + insertions) / reference words, by edit distance over words."""
    if not reference:
        return 0.0 if not heard else 1.0
    previous = list(range(len(heard) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i]
        for j, hyp in enumerate(heard, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp)))
        previous = current
    return previous[-1] / len(reference)


# -- audio ----------------------------------------------------------------------------------------

def silence_share(audio: np.ndarray, rate: int, level_db: float) -> float:
    """Share of 20 ms frames whose RMS level is below `level_db` dBFS."""
    frame = max(1, rate // 50)
    count = len(audio) // frame
    if count == 0:
        return 1.0
    frames = audio[: count * frame].astype(np.float64).reshape(count, frame)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    return float(np.mean(rms < 10 ** (level_db / 20)))


def to_asr_rate(audio: np.ndarray, rate: int) -> np.ndarray:
    import soxr

    return audio if rate == ASR_RATE else soxr.resample(audio, rate, ASR_RATE).astype(np.float32, copy=False)


# -- recognisers ----------------------------------------------------------------------------------

class PocketSphinx:
    """CMU PocketSphinx with the US English model its wheel ships."""

    def __init__(self, cfg: ValidateConfig):
        from pocketsphinx import Decoder

        self.decoder = Decoder(loglevel="FATAL")

    def transcribe(self, audio16k: np.ndarray) -> str:
        pcm = (np.clip(audio16k, -1.0, 1.0) * 32767).astype("<i2")
        self.decoder.start_utt()
        self.decoder.process_raw(pcm.tobytes(), full_utt=True)
        self.decoder.end_utt()
        hyp = self.decoder.hyp()
        return hyp.hypstr if hyp else ""


class OpenAIWhisper:
    """openai-whisper on a local checkpoint file (whisper.load_model takes a path)."""

    def __init__(self, cfg: ValidateConfig):
        import whisper

        self.model = whisper.load_model(cfg.model_path)
        self.fp16 = self.model.device.type == "cuda"

    def transcribe(self, audio16k: np.ndarray) -> str:
        result = self.model.transcribe(audio16k, language="en", temperature=0.0, fp16=self.fp16,
                                       condition_on_previous_text=False)
        return result["text"]


class FasterWhisper:
    """faster-whisper (CTranslate2) on a local model directory."""

    def __init__(self, cfg: ValidateConfig):
        from faster_whisper import WhisperModel

        self.model = WhisperModel(cfg.model_path, device="auto", compute_type="default", local_files_only=True)

    def transcribe(self, audio16k: np.ndarray) -> str:
        segments, _ = self.model.transcribe(audio16k, language="en", beam_size=1, condition_on_previous_text=False)
        return " ".join(s.text for s in segments)


RECOGNISER_CLASSES = {"pocketsphinx": (PocketSphinx, "pocketsphinx", "pocketsphinx==5.1.1"),
                      "whisper": (OpenAIWhisper, "whisper", "openai-whisper"),
                      "faster-whisper": (FasterWhisper, "faster_whisper", "faster-whisper")}


def check_gate(cfg: ValidateConfig) -> None:
    """Before anything starts: the packages the enabled gate needs are installed."""
    if not cfg.enabled:
        return
    import importlib.util

    needed = [("soxr", "soxr")] if cfg.recogniser != "none" else []
    if cfg.recogniser in RECOGNISER_CLASSES:
        needed.append(RECOGNISER_CLASSES[cfg.recogniser][1:])
    for module, package in needed:
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"validate.recogniser={cfg.recogniser} needs {package}: pip install {package} "
                              "(or pip install 'convtts[validate]'), or set validate.recogniser=none")


# -- the gate -------------------------------------------------------------------------------------

@dataclass
class Gate:
    cfg: ValidateConfig
    recogniser: object = field(default=None, repr=False)
    lexicon: frozenset | None = field(default=None, repr=False)

    def judge(self, audio: np.ndarray, rate: int, text: str, uid: str = "") -> dict:
        """The take's scores; raises QualityFailure at the first check it fails (the ASR runs last)."""
        started = time.perf_counter()
        cfg, words = self.cfg, spoken_words(text)
        per_word = len(audio) / rate / max(1, len(words))
        scores = {"seconds_per_word": round(per_word, 4),
                  "silence": round(silence_share(audio, rate, cfg.silence_db), 4),
                  "clipped": round(float(np.mean(np.abs(audio) >= cfg.clip_level)), 5)}
        self._limit("short", per_word, cfg.min_seconds_per_word, scores, below=True)
        self._limit("long", per_word, cfg.max_seconds_per_word, scores)
        self._limit("silence", scores["silence"], cfg.max_silence_share, scores)
        self._limit("clipped", scores["clipped"], cfg.max_clipped_share, scores)
        self._asr(audio, rate, text, words, uid, scores)
        scores["gate_seconds"] = round(time.perf_counter() - started, 4)
        self._limit("wer", scores.get("wer"), cfg.max_wer, scores)
        return scores

    def _asr(self, audio: np.ndarray, rate: int, text: str, words: list[str], uid: str, scores: dict) -> None:
        if self.recogniser is None:
            scores["asr"] = "off"
        elif not in_share(uid, self.cfg.asr_share):
            scores["asr"] = "skipped: not sampled"
        elif len(words) < self.cfg.min_asr_words:
            scores["asr"] = f"skipped: under {self.cfg.min_asr_words} words"
        elif not looks_english(text, self.lexicon):
            scores["asr"] = "skipped: not English"
        else:
            heard = self.recogniser.transcribe(to_asr_rate(audio, rate))
            scores.update(asr=self.cfg.recogniser, heard=heard[:1000],
                          wer=round(word_error_rate(words, spoken_words(heard)), 4))

    @staticmethod
    def _limit(check: str, figure, limit: float, scores: dict, below: bool = False) -> None:
        if figure is not None and (figure < limit if below else figure > limit):
            raise QualityFailure(check, figure, limit, scores)


def in_share(uid: str, share: float) -> bool:
    """Whether an id falls in the sampled share: decided by the id alone, so a rerun samples the same ids."""
    if share >= 1:
        return True
    digest = hashlib.blake2b(f"asr:{uid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < share


def open_gate(cfg: ValidateConfig) -> Gate | None:
    """The worker's gate (its recogniser loaded once per process), or None when validate is off."""
    if not cfg.enabled:
        return None
    started = time.time()
    recogniser = RECOGNISER_CLASSES[cfg.recogniser][0](cfg) if cfg.recogniser != "none" else None
    lexicon = english_lexicon() if recogniser is not None else None
    log.info("quality gate on (recogniser %s), loaded in %.2fs", cfg.recogniser, time.time() - started)
    return Gate(cfg, recogniser, lexicon)
