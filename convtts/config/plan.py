"""What decides the plan: the selection, the text rules, the speakers and the shards."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from convtts.config.errors import ConfigError


@dataclass(frozen=True)
class SelectConfig:
    fraction: float | None = None  # keep this share of the conversations (0 < f <= 1)
    count: int | None = None  # or keep this many
    seed: int = 0

    def check(self) -> None:
        if self.fraction is not None and self.count is not None:
            raise ConfigError("select.fraction and select.count are exclusive: set one")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ConfigError(f"select.fraction must be in (0, 1], got {self.fraction}")
        if self.count is not None and self.count < 1:
            raise ConfigError(f"select.count must be at least 1, got {self.count}")


@dataclass(frozen=True)
class TextConfig:
    max_words: int = 30  # a segment never holds more words than this
    max_turn_chars: int = 20000  # longer turns are recorded as skipped, not spoken
    words_per_minute: float = 150.0  # only for the plan's estimate of audio hours
    speak_roles: tuple[str, ...] = ("human", "assistant")
    # How a link is said: domain ('https://www.nodejs.org/en/download' -> 'nodejs dot org') or phrase
    # (link_phrase in its place). Dropping it would leave a hole: 'See and for Node.js.'
    links: str = "domain"
    link_phrase: str = "a link"
    # What takes the place of a fenced code block, of [asy] drawing code and of math too long to read
    # aloud (more than dense_math_words words). Empty: the turn's language's own words ('as shown in
    # the code', 'as shown in the figure', 'a long expression'; zh '如代码所示', '如图所示', '一个很长的算式').
    code_phrase: str = ""
    figure_phrase: str = ""
    dense_math_phrase: str = ""
    dense_math_words: int = 60
    # Each turn's language, an ISO 639-1 code (zh, ja, en ...), or auto: found from its text
    # (convtts/language.py). A turn in a language the voice does not speak is skipped.
    language: str = "auto"
    # Chinese, Japanese and Korean segments are measured in characters: at most this many.
    # CosyVoice's own frontend cuts Chinese into pieces of at most 80 characters (split_paragraph's token_max_n).
    max_chars: int = 80
    # Speaking rates of the languages measured in characters, for the plan's estimate of audio hours
    chars_per_minute: dict[str, float] = field(default_factory=lambda: dict(CHARS_PER_MINUTE))

    def check(self) -> None:
        if self.max_words < 3:
            raise ConfigError(f"text.max_words must be at least 3, got {self.max_words}")
        if not 10 <= self.max_chars <= MAX_CHARS_CEILING:
            raise ConfigError(f"text.max_chars must be between 10 and {MAX_CHARS_CEILING}, got {self.max_chars}")
        if self.language != "auto" and not LANGUAGE_CODE.fullmatch(self.language):
            raise ConfigError(
                f"text.language must be auto or an ISO 639-1 code such as en or zh, got {self.language!r}"
            )
        for language, rate in self.chars_per_minute.items():
            if not LANGUAGE_CODE.fullmatch(language) or rate <= 0:
                raise ConfigError(f"text.chars_per_minute.{language} must be a language code with a positive rate")
        if self.max_turn_chars < 100:
            raise ConfigError(f"text.max_turn_chars must be at least 100, got {self.max_turn_chars}")
        if self.words_per_minute <= 0:
            raise ConfigError("text.words_per_minute must be positive")
        unknown = set(self.speak_roles) - {"human", "assistant", "system"}
        if unknown or not self.speak_roles:
            raise ConfigError(f"text.speak_roles takes human, assistant, system; got {list(self.speak_roles)}")
        if self.links not in LINK_STYLES:
            raise ConfigError(f"text.links must be one of {LINK_STYLES}, got {self.links!r}")
        if not _LINK_PHRASE.fullmatch(self.link_phrase):
            raise ConfigError(
                f"text.link_phrase must be one to five words of letters (a voice says it), got {self.link_phrase!r}"
            )
        for key in ("code_phrase", "figure_phrase", "dense_math_phrase"):
            value = getattr(self, key)
            if value and not _SPOKEN_PHRASE.fullmatch(value):
                raise ConfigError(
                    f"text.{key} must be empty or one to eight words of letters (a voice says it), got {value!r}"
                )
        if self.dense_math_words < 5:
            raise ConfigError(f"text.dense_math_words must be at least 5, got {self.dense_math_words}")

    def phrases(self) -> SpokenPhrases:
        """The phrases clean() puts in place of code, drawings and dense math."""
        return SpokenPhrases(self.code_phrase, self.figure_phrase, self.dense_math_phrase, self.dense_math_words)

    def seconds(self, units: float, language: str | None) -> float:
        """Estimated seconds of speech: characters at chars_per_minute for the languages counted in
        characters, words at words_per_minute for the others."""
        rate = self.chars_per_minute.get(language) or CHARS_PER_MINUTE.get(language) or self.words_per_minute
        return units * 60.0 / rate

    def link_words(self) -> str | None:
        """What a link is said as: None for its domain, else the phrase."""
        return self.link_phrase if self.links == "phrase" else None


@dataclass(frozen=True)
class SpokenPhrases:
    """What cleaning says in place of what a voice cannot read; empty: the turn's language's own words."""

    code: str = ""
    figure: str = ""
    dense_math: str = ""
    dense_math_words: int = 60


LINK_STYLES = ("domain", "phrase")
# Characters a minute of speech: Mandarin and Cantonese about 4.5 syllables (one character each) a
# second, Japanese about 5.5 characters (kanji and kana together), Korean about 5 syllable blocks.
CHARS_PER_MINUTE = {"zh": 270.0, "yue": 270.0, "ja": 330.0, "ko": 300.0}
MAX_CHARS_CEILING = 150  # no setting makes a CJK segment longer: past it the voices run on and babble
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}")
# 'a link', 'the website', 'l'adresse': words a voice can say, no markup or digits
_LINK_PHRASE = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*(?: [^\W\d_]+(?:['’-][^\W\d_]+)*){0,4}")
_SPOKEN_PHRASE = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*(?: [^\W\d_]+(?:['’-][^\W\d_]+)*){0,7}")


SPEAKER_POLICIES = ("by_role", "per_turn", "single")


@dataclass(frozen=True)
class SpeakerConfig:
    voices: tuple[str, ...] = ("joe", "joe-slow")
    # by_role: per conversation one voice for the human side, another for the assistant side;
    # per_turn: a seeded voice for every turn; single: voices[0] everywhere.
    policy: str = "by_role"
    human: tuple[str, ...] = ()  # restrict the human side to these voices (default: all)
    assistant: tuple[str, ...] = ()
    seed: int = 0
    # A pool of zero-shot voices instead of speakers.voices: a directory of recordings with .txt
    # transcripts, or a .jsonl / .csv manifest of name, audio, text (convtts/speak/pool.py).
    pool: str = ""
    # The voices a turn of each language takes, e.g. {zh: [中文女, 中文男], en: [英文女]} (ISO 639-1, as
    # the plan tags turns); turns of a language not listed take any voice. Empty: the voices grouped
    # by the language each says it speaks (a prompt's or pool row's `language`, a built-in speaker's name).
    by_language: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def check(self) -> None:
        if not self.voices:
            raise ConfigError("speakers.voices must name at least one voice")
        for language, voices in self.by_language.items():
            if not voices:
                raise ConfigError(f"speakers.by_language.{language} names no voice")
        if self.policy not in SPEAKER_POLICIES:
            raise ConfigError(f"speakers.policy must be one of {SPEAKER_POLICIES}, got {self.policy!r}")
        if self.pool:
            if not Path(self.pool).exists():
                raise ConfigError(f"speakers.pool not found: {self.pool}")
            return  # human and assistant name the pool's voices: checked when it is read
        for side in ("human", "assistant"):
            stray = [v for v in getattr(self, side) if v not in self.voices]
            if stray:
                raise ConfigError(f"speakers.{side} names voices not in speakers.voices: {stray}")
        for language, voices in self.by_language.items():
            stray = [v for v in voices if v not in self.voices]
            if stray:
                raise ConfigError(f"speakers.by_language.{language} names voices not in speakers.voices: {stray}")


@dataclass(frozen=True)
class ShardConfig:
    segments_per_shard: int = 200

    def check(self) -> None:
        if self.segments_per_shard < 1:
            raise ConfigError("shards.segments_per_shard must be at least 1")
