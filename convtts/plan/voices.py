"""Voices: the pool (speakers.pool) of hundreds to thousands of prompt recordings, and who speaks what (Casting).

The pool's format is convtts/speak/pool.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from convtts.config import ConfigError, SpeakerConfig
from convtts.speak.pool import read_pool

# --- what the plan sees of a pool --------------------------------------------------------------


def voice_names(config: SpeakerConfig) -> tuple[str, ...]:
    """The voices the plan assigns: the pool's (sorted by name), or speakers.voices without a pool.

    A side restricted by speakers.human / speakers.assistant must name voices of the pool.
    """
    if not config.pool:
        return config.voices
    names = tuple(voice.name for voice in read_pool(config.pool))
    known = set(names)
    for side in ("human", "assistant"):
        stray = [v for v in getattr(config, side) if v not in known]
        if stray:
            raise ConfigError(f"speakers.{side} names voices that are not in speakers.pool {config.pool}: {stray[:5]}")
    return names


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

    @classmethod
    def of(cls, config: SpeakerConfig, voices: tuple[str, ...] | None = None) -> Casting:
        """`voices` as voice_names(config) gives them (read once by the caller: a pool is a file to read)."""
        voices = tuple(config.voices if voices is None else voices)
        human, assistant = tuple(config.human or voices), tuple(config.assistant or voices)
        return cls(config, voices, human, assistant, places_of(voices), places_of(assistant))

    def sides(self, cid: str) -> dict[str, str]:
        """by_role: a voice per side for this conversation, the two sides apart when 2+ voices allow."""
        seed = self.config.seed
        if self.config.policy == "single":
            return dict.fromkeys(("human", "assistant", "system"), self.voices[0])
        human = _pick(self.human, seed, cid, "human")
        assistant = _pick_without(self.assistant, self.assistant_places, (human,), seed, cid, "assistant") or _pick(
            self.assistant, seed, cid, "assistant"
        )
        system = _pick_without(self.voices, self.voice_places, (human, assistant), seed, cid, "system") or assistant
        return {"human": human, "assistant": assistant, "system": system}

    def turn(self, cid: str, turn: int, side: str, sides: dict[str, str]) -> str:
        if self.config.policy != "per_turn":
            return sides[side]
        pool = {"human": self.human, "assistant": self.assistant}.get(side, self.voices)
        return _pick(pool, self.config.seed, cid, turn)


def side_voices(cid: str, config: SpeakerConfig, voices: tuple[str, ...] | None = None) -> dict[str, str]:
    return Casting.of(config, voices).sides(cid)
