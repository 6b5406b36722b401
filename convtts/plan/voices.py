"""Voices: the pool (speakers.pool) of hundreds to thousands of prompt recordings, and who speaks what (Casting).

The pool's format is convtts/speak/pool.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from convtts.config import Config, ConfigError, SpeakerConfig
from convtts.speak.pool import read_pool

# --- what the plan sees of a pool --------------------------------------------------------------


def voice_names(config: SpeakerConfig, pool: list | None = None) -> tuple[str, ...]:
    """The voices the plan assigns: the pool's (sorted by name), or speakers.voices without a pool.

    A side restricted by speakers.human / speakers.assistant, or a language's voices in
    speakers.by_language, must name voices of the pool. `pool`: its voices, read_pool's, if read already.
    """
    if not config.pool:
        return config.voices
    names = tuple(voice.name for voice in (pool if pool is not None else read_pool(config.pool)))
    known = set(names)
    named = {f"speakers.{side}": getattr(config, side) for side in ("human", "assistant")}
    named.update({f"speakers.by_language.{lang}": voices for lang, voices in config.by_language.items()})
    for where, voices in named.items():
        stray = [v for v in voices if v not in known]
        if stray:
            raise ConfigError(f"{where} names voices that are not in speakers.pool {config.pool}: {stray[:5]}")
    return names


# CosyVoice-300M-SFT's built-in speakers, by the language their names say
BUILTIN_LANGUAGES = {
    "中文女": "zh",
    "中文男": "zh",
    "英文女": "en",
    "英文男": "en",
    "日语男": "ja",
    "粤语女": "yue",
    "韩语女": "ko",
}


def said_languages(config: SpeakerConfig, prompts: dict, pool: list | None = None) -> dict[str, str]:
    """The language each voice says it speaks, where it says one: a pool row's `language`, a
    prompt's (tts.cosyvoice.prompts), or a built-in speaker's name. `pool` as voice_names takes it."""
    if config.pool:
        voices = pool if pool is not None else read_pool(config.pool)
        return {voice.name: voice.language for voice in voices if voice.language}
    said = {voice: BUILTIN_LANGUAGES[voice] for voice in config.voices if voice in BUILTIN_LANGUAGES}
    said.update(
        {voice: prompts[voice].language for voice in config.voices if voice in prompts and prompts[voice].language}
    )
    return said


def voices_by_language(
    config: SpeakerConfig, voices: tuple[str, ...], said: dict[str, str]
) -> dict[str, tuple[str, ...]]:
    """The voices each language's turns take: speakers.by_language, else the voices grouped by the
    language they say they speak. A language whose voices are all of them is left out: its turns
    would take any voice anyway (and the plans of configs whose voices share one language stay as they were)."""
    if config.by_language:
        groups = {lang: tuple(names) for lang, names in config.by_language.items()}
    else:
        groups: dict[str, tuple[str, ...]] = {}
        for voice in voices:
            if voice in said:
                groups[said[voice]] = (*groups.get(said[voice], ()), voice)
    everyone = set(voices)
    return {lang: names for lang, names in sorted(groups.items()) if set(names) != everyone}


def names_digest(names: tuple[str, ...]) -> str:
    """What the plan depends on in a pool: its voices' names (a recording or a transcript can change
    without changing which conversation gets which voice)."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode("utf-8", "surrogatepass") + b"\0")
    return f"{len(names)} voices, sha256 {digest.hexdigest()}"


# --- who speaks what --------------------------------------------------------------------------


def _number(*key) -> int:
    """The seeded number a pick takes: blake2b of the key's parts (the planner's ids use the same hash)."""
    text = "\0".join(map(str, key))
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


def _pick(pool: Sequence[str], *key) -> str:
    return pool[_number(*key) % len(pool)]


def _pick_without(
    pool: Sequence[str], places: dict[str, tuple[int, ...]], left_out: tuple[str, ...], *key
) -> str | None:
    """_pick from `pool` with the voices `left_out` taken out of it, without copying it (None if none is left).

    The same voice as _pick([v for v in pool if v not in left_out], *key), in constant time for a pool
    of thousands: the n-th voice left is found by stepping over the places of those taken out.
    """
    gone = sorted({place for voice in left_out for place in places.get(voice, ())})
    if len(gone) == len(pool):
        return None
    index = _number(*key) % (len(pool) - len(gone))
    for place in gone:
        if index >= place:
            index += 1
    return pool[index]


def places_of(pool: Sequence[str]) -> dict[str, tuple[int, ...]]:
    places: dict[str, list[int]] = {}
    for place, voice in enumerate(pool):
        places.setdefault(voice, []).append(place)
    return {voice: tuple(found) for voice, found in places.items()}


@dataclass(frozen=True)
class Casting:
    """Who speaks what: the voices (speakers.voices, or the pool's), each side's choice, and the seeded rule."""

    config: SpeakerConfig
    voices: tuple[str, ...]
    human: tuple[str, ...]
    assistant: tuple[str, ...]
    voice_places: dict
    assistant_places: dict
    by_language: dict = None  # language -> the Casting of its voices (voices_by_language)

    @classmethod
    def of(
        cls, config: SpeakerConfig, voices: tuple[str, ...] | None = None, said: dict[str, str] | None = None
    ) -> Casting:
        """`voices` as voice_names(config) gives them (read once by the caller: a pool is a file to read);
        `said` the languages voices say they speak (said_languages)."""
        voices = tuple(config.voices if voices is None else voices)
        groups = voices_by_language(config, voices, said or {})
        human, assistant = tuple(config.human or voices), tuple(config.assistant or voices)
        by_language = {lang: cls.restricted(config, names, human, assistant) for lang, names in groups.items()}
        return cls(config, voices, human, assistant, places_of(voices), places_of(assistant), by_language)

    @classmethod
    def restricted(cls, config, voices: tuple[str, ...], human: tuple[str, ...], assistant: tuple[str, ...]) -> Casting:
        """The casting of one language's voices: each side keeps those of its own it allows, or takes them all."""
        human = tuple(v for v in human if v in voices) or voices
        assistant = tuple(v for v in assistant if v in voices) or voices
        return cls(config, voices, human, assistant, places_of(voices), places_of(assistant), {})

    def of_language(self, language: str | None) -> Casting:
        return (self.by_language or {}).get(language, self)

    def sides(self, cid: str, language: str | None = None) -> dict[str, str]:
        """by_role: a voice per side for this conversation (among its language's voices, where
        speakers.by_language has some), the two sides apart when 2+ voices allow."""
        casting = self.of_language(language)
        if casting is not self:
            return casting.sides(cid)
        seed = self.config.seed
        if self.config.policy == "single":
            return dict.fromkeys(("human", "assistant", "system"), self.voices[0])
        human = _pick(self.human, seed, cid, "human")
        assistant = _pick_without(self.assistant, self.assistant_places, (human,), seed, cid, "assistant") or _pick(
            self.assistant, seed, cid, "assistant"
        )
        system = _pick_without(self.voices, self.voice_places, (human, assistant), seed, cid, "system") or assistant
        return {"human": human, "assistant": assistant, "system": system}

    def turn(self, cid: str, turn: int, side: str, sides: dict[str, str], language: str | None = None) -> str:
        """The voice of one turn: its side's (`sides`, of the turn's language), or per_turn a seeded one."""
        if self.config.policy != "per_turn":
            return sides[side]
        casting = self.of_language(language)
        pool = {"human": casting.human, "assistant": casting.assistant}.get(side, casting.voices)
        return _pick(pool, self.config.seed, cid, turn)


def side_voices(cid: str, config: SpeakerConfig, voices: tuple[str, ...] | None = None) -> dict[str, str]:
    return Casting.of(config, voices).sides(cid)


def casting_for(config: Config) -> Casting:
    """Who speaks what under this config: its voices (or its pool's), grouped by language."""
    speakers = config.speakers
    pool = read_pool(speakers.pool) if speakers.pool else None  # read once for the names and the languages
    said = said_languages(speakers, config.tts.cosyvoice.prompts, pool)
    return Casting.of(speakers, voice_names(speakers, pool), said)
