"""The quality gate: score each take (length per word, silence, clipping, an ASR round trip) before it is written.

A take that fails a check raises QualityFailure naming the check and its figure, e.g. `wer 0.83 > 0.6`;
the caller speaks the utterance again with the next take's seed (take_seed) up to
validate.max_respeaks times, then records the failure. Errors (exceptions, crashes) are counted apart,
by workers.max_attempts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field

import numpy as np

from convtts.config import ConfigError, ValidateConfig
from convtts.counts import plural
from convtts.gate.recognisers import check_recogniser_installed, load_recogniser
from convtts.language import CHARACTER_LANGUAGES, language_of

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

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
_CURRENCY = {"$": "dollars", "€": "euros", "£": "pounds"}
_MONEY = re.compile(r"([$€£])\s?(\d[\d,]*(?:\.\d+)?)")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_SYMBOLS = {"%": " percent ", "&": " and ", "°": " degrees ", "+": " plus ", "=": " equals ", "@": " at "}
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


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


def spoken_words(text: str, language: str = "en") -> list[str]:
    """The words a listener hears, lower case: `It costs $12.50, 20% off` -> it costs twelve point five zero dollars
    twenty percent off. In a language written in characters, each CJK character is a unit of its own
    and numbers stay digits (a recogniser writes 12 or 十二, never twelve)."""
    text = text.lower().replace("’", "'")
    if language not in CHARACTER_LANGUAGES:
        text = _MONEY.sub(lambda m: f"{m.group(2)} {_CURRENCY[m.group(1)]}", text)
        text = _NUMBER.sub(_spell_number, text)
        for symbol, word in _SYMBOLS.items():
            text = text.replace(symbol, word)
    text = _CJK.sub(lambda m: f" {m.group(0)} ", text)  # no spaces between CJK words: count characters
    return _WORD.findall(text)


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


def align_words(reference: list[str], heard: list[str]) -> list[tuple[int | None, int | None]]:
    """A least-cost word alignment (the edit distance's backtrace), in order: (i, j) pairs reference
    word i with heard word j (the same word or a substitution), (i, None) is a deleted reference word,
    (None, j) an inserted heard word. On a tie, walking back from the end, an insertion is taken
    first, then a pair: surplus heard words sit after the reference words they follow, so a take
    that says more words than it should keeps them (split_heard), rather than its neighbour before."""
    cost = [list(range(len(heard) + 1))]
    for i, ref in enumerate(reference, 1):
        row = [i]
        for j, hyp in enumerate(heard, 1):
            row.append(min(cost[i - 1][j] + 1, row[j - 1] + 1, cost[i - 1][j - 1] + (ref != hyp)))
        cost.append(row)
    path: list[tuple[int | None, int | None]] = []
    i, j = len(reference), len(heard)
    while i or j:
        if j and cost[i][j] == cost[i][j - 1] + 1:
            j -= 1
            path.append((None, j))
        elif i and j and cost[i][j] == cost[i - 1][j - 1] + (reference[i - 1] != heard[j - 1]):
            i, j = i - 1, j - 1
            path.append((i, j))
        else:
            i -= 1
            path.append((i, None))
    return path[::-1]


def split_heard(references: list[list[str]], heard: list[str]) -> list[list[str]]:
    """A packed window's heard words shared out among its takes (`references`: each take's words, in
    window order), by aligning them to the takes' joined words: a word paired with a take's word is
    that take's; an inserted word goes to the take of the nearest reference word before it (the
    first take at the very start). A take all of whose words were deleted hears nothing."""
    owner = [number for number, words in enumerate(references) for _ in words]
    shares: list[list[str]] = [[] for _ in references]
    take = 0
    for i, j in align_words([word for words in references for word in words], heard):
        if i is not None:
            take = owner[i]
        if j is not None:
            shares[take].append(heard[j])
    return shares


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


def check_gate(cfg: ValidateConfig, device: str | None = None) -> None:
    """Before anything starts: the packages the enabled gate needs are installed, and a slot on the
    CPU (`device`) is not asked to run Whisper on a GPU."""
    if not cfg.enabled:
        return
    check_recogniser_installed(cfg)
    if device == "cpu" and cfg.recogniser == "hf-whisper" and cfg.asr_device == "cuda":
        raise ConfigError(
            "validate.asr_device=cuda, but this slot runs on the CPU: set validate.asr_device=auto or cpu"
        )


# -- the gate -------------------------------------------------------------------------------------


@dataclass
class Take:
    """A take to score: its samples and their rate, the text it should say, its utterance's id, and
    the text's language (ISO 639-1; empty: the language test's answer)."""

    audio: np.ndarray
    rate: int
    text: str
    uid: str = ""
    language: str = ""


@dataclass
class Gate:
    cfg: ValidateConfig
    recogniser: object = field(default=None, repr=False)

    @property
    def batch_rows(self) -> int:
        """Takes worth judging at once: a batched recogniser's batch (validate.asr_batch), else 1."""
        return self.cfg.asr_batch if hasattr(self.recogniser, "transcribe_many") else 1

    @property
    def packs(self) -> bool:
        """Whether takes judged together share Whisper's 30 s windows (validate.asr_pack, hf-whisper)."""
        return self.cfg.asr_pack and hasattr(self.recogniser, "transcribe_many")

    def batch_full(self, seconds: list[float]) -> bool:
        """Whether takes of these durations are worth a recogniser call: batch_rows of them or, packing,
        enough to open the asr_batch-th window (the others full: the call's encoder pass is spent on
        audio, not padding, and its decoding steps, one after the other, on many takes)."""
        if not self.packs:
            return len(seconds) >= self.batch_rows
        from convtts.gate.whisper import pack_takes

        return len(pack_takes([round(s * ASR_RATE) for s in seconds])) >= self.cfg.asr_batch

    def judge(self, audio: np.ndarray, rate: int, text: str, uid: str = "", language: str = "") -> dict:
        """The take's scores; raises QualityFailure at the first check it fails (the ASR runs last)."""
        verdict = self.judge_many([Take(audio, rate, text, uid, language)])[0]
        if isinstance(verdict, BaseException):
            raise verdict
        return verdict

    def judge_many(self, takes: list[Take]) -> list:
        """Each take's scores, or the QualityFailure that refused it, or the recogniser's error on it.

        The signal checks run take by take; the takes that pass them and get the ASR check are
        transcribed together (one call of a batched recogniser), and each take's gate_seconds is its
        own checks' time plus its share of that call.
        """
        takes = [self._with_language(take) for take in takes]
        verdicts = [self._signal(take) for take in takes]
        asked = [
            i for i, verdict in enumerate(verdicts) if isinstance(verdict, dict) and self._asr_wanted(takes[i], verdict)
        ]
        started = time.perf_counter()
        heard, packed = self._transcribe([takes[i] for i in asked])
        share = (time.perf_counter() - started) / max(1, len(asked))
        for i, text, shared in zip(asked, heard, packed):
            verdicts[i]["gate_seconds"] = round(verdicts[i]["gate_seconds"] + share, 4)
            verdicts[i] = text if isinstance(text, BaseException) else self._scored(takes[i], verdicts[i], text, shared)
        return verdicts

    def _with_language(self, take: Take) -> Take:
        """The take with the language it is heard in: English under assume_english, else its row's, else
        the language test's."""
        if self.cfg.assume_english:
            return dataclasses.replace(take, language="en")
        if take.language or self.recogniser is None:
            return take
        return dataclasses.replace(take, language=language_of(take.text))

    def _signal(self, take: Take):
        """Length per spoken word, silence, clipping: the scores so far, or the QualityFailure."""
        started = time.perf_counter()
        cfg, words = self.cfg, spoken_words(take.text, take.language)
        per_word = len(take.audio) / take.rate / max(1, len(words))
        scores = {
            "seconds_per_word": round(per_word, 4),
            "silence": round(silence_share(take.audio, take.rate, cfg.silence_db), 4),
            "clipped": round(float(np.mean(np.abs(take.audio) >= cfg.clip_level)), 5),
        }
        try:
            self._limit("short", per_word, cfg.min_seconds_per_word, scores, below=True)
            self._limit("long", per_word, cfg.max_seconds_per_word, scores)
            self._limit("silence", scores["silence"], cfg.max_silence_share, scores)
            self._limit("clipped", scores["clipped"], cfg.max_clipped_share, scores)
        except QualityFailure as bad:
            return bad
        scores["gate_seconds"] = time.perf_counter() - started
        return scores

    def _asr_wanted(self, take: Take, scores: dict) -> bool:
        """Whether the take gets the ASR check; if not, scores["asr"] says why."""
        if self.recogniser is None:
            scores["asr"] = "off"
        elif not in_share(take.uid, self.cfg.asr_share):
            scores["asr"] = "skipped: not sampled"
        elif len(spoken_words(take.text, take.language)) < self.cfg.min_asr_words:
            scores["asr"] = f"skipped: under {self.cfg.min_asr_words} words"
        elif not self.recogniser.hears(take.language):
            scores["asr"] = f"skipped: language {take.language}: {self.cfg.recogniser} does not hear it"
        if "asr" in scores:
            scores["gate_seconds"] = round(scores["gate_seconds"], 4)
        return "asr" not in scores

    def _transcribe(self, takes: list[Take]) -> tuple[list, list[int]]:
        """A transcript (or the error) per take, and how many takes its window held (0: not packed),
        the takes of each language recognised together in it."""
        heard: list = [""] * len(takes)
        packed = [0] * len(takes)
        for language in dict.fromkeys(take.language for take in takes):
            numbers = [n for n, take in enumerate(takes) if take.language == language]
            texts, counts = self._transcribe_in([takes[n] for n in numbers], language)
            for n, text, count in zip(numbers, texts, counts):
                heard[n], packed[n] = text, count
        return heard, packed

    def _transcribe_in(self, takes: list[Take], language: str) -> tuple[list, list[int]]:
        """_transcribe for takes of one language; a batch the recogniser fails on is tried one take at a time."""
        audio = [to_asr_rate(take.audio, take.rate) for take in takes]
        many = getattr(self.recogniser, "transcribe_many", None)
        if many is not None and len(audio) > 1:
            try:
                heard = many(audio, pack=self.packs, language=language)
            except Exception as exc:  # e.g. out of GPU memory at this batch size
                log.warning(
                    "the recogniser failed on %d takes at once (%s: %s); trying them one at a time",
                    len(audio),
                    type(exc).__name__,
                    exc,
                )
            else:
                return unpack(takes, heard) if self.packs else (heard, [0] * len(audio))
        heard = []
        for samples in audio:
            try:
                heard.append(self.recogniser.transcribe(samples, language))
            except Exception as exc:  # this take's: the caller counts it as the utterance's error
                heard.append(exc)
        return heard, [0] * len(audio)

    def _scored(self, take: Take, scores: dict, heard: str, packed: int = 0):
        """The ASR's scores: the word error rate (wer), or for a language written in characters the
        character error rate (cer), each against its limit for the take's language."""
        by_characters = take.language in CHARACTER_LANGUAGES
        check = "cer" if by_characters else "wer"
        error = word_error_rate(spoken_words(take.text, take.language), spoken_words(heard, take.language))
        scores.update({"asr": self.cfg.recogniser, "asr_language": take.language, "heard": heard[:1000]})
        scores[check] = round(error, 4)
        if packed:
            scores["asr_packed"] = packed
        limit = self.cfg.max_error_by_language.get(take.language)
        limit = limit if limit is not None else (self.cfg.max_cer if by_characters else self.cfg.max_wer)
        try:
            self._limit(check, scores[check], limit, scores)
        except QualityFailure as bad:
            return bad
        return scores

    @staticmethod
    def _limit(check: str, figure, limit: float, scores: dict, below: bool = False) -> None:
        if figure is not None and (figure < limit if below else figure > limit):
            raise QualityFailure(check, figure, limit, scores)


def unpack(takes: list[Take], windows: list) -> tuple[list[str], list[int]]:
    """Each take's transcript from the packed windows (whisper.Heard) and how many takes its window
    held: a take alone keeps its window's transcript, takes packed together share theirs out by
    split_heard, each then scored on its own words as if heard alone."""
    heard, packed = [""] * len(takes), [0] * len(takes)
    for window in windows:
        if len(window.takes) == 1:
            shares = [window.text]
        else:
            language = takes[window.takes[0]].language  # a window holds takes of one language
            words = split_heard(
                [spoken_words(takes[n].text, language) for n in window.takes], spoken_words(window.text, language)
            )
            shares = [" ".join(share) for share in words]
        for number, text in zip(window.takes, shares):
            heard[number], packed[number] = text, len(window.takes)
    return heard, packed


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
    recogniser = load_recogniser(cfg)
    gate = Gate(cfg, recogniser)
    at_once = f"{plural(gate.batch_rows, 'window')} of packed takes" if gate.packs else plural(gate.batch_rows, "take")
    log.info(
        "quality gate on (recogniser %s, %s at a time), loaded in %.2fs", cfg.recogniser, at_once, time.time() - started
    )
    return gate
