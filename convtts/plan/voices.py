"""Voices: the pool (speakers.pool) of hundreds to thousands of prompt recordings, and who speaks what (Casting).

A pool is one of:
- a directory: each audio file (.wav, .flac, .ogg, .mp3) with its transcript beside it in a .txt
  (or .lab) file of the same name; the voice's name is the file name without its extension, and
  files in subdirectories are named by their relative path (`en/anna`);
- a JSON-lines manifest (.jsonl): one `{"name": "anna", "audio": "prompts/anna.wav", "text": "..."}`
  a line, `name` optional (the audio file's name without its extension);
- a CSV manifest (.csv) with a header row holding at least `audio` and `text` (and `name`).
Relative audio paths are read from the manifest's folder. The voices are kept sorted by name, so the
order of the lines does not change which conversation gets which voice. Reading a pool checks its
structure (every voice has a transcript, no name twice); the backend checks the recordings.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from convtts.config import ConfigError, SpeakerConfig

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
TRANSCRIPT_SUFFIXES = (".txt", ".lab")


@dataclass(frozen=True)
class PoolVoice:
    name: str
    audio: str  # the recording's path, absolute
    text: str  # its transcript
    where: str  # where the pool defines it, for error messages: 'voices.jsonl line 17'


def read_pool(path: str | Path) -> list[PoolVoice]:
    """The pool's voices, sorted by name; ConfigError names the line or file that is wrong."""
    path = Path(path)
    if path.is_dir():
        voices = _from_directory(path)
    elif path.suffix.lower() == ".jsonl":
        voices = _from_jsonl(path)
    elif path.suffix.lower() == ".csv":
        voices = _from_csv(path)
    elif path.exists():
        raise ConfigError(f"speakers.pool {path}: a pool is a directory, a .jsonl or a .csv manifest")
    else:
        raise ConfigError(f"speakers.pool not found: {path}")
    if not voices:
        raise ConfigError(f"speakers.pool {path} holds no voices")
    return _unique(sorted(voices, key=lambda v: v.name))


def _unique(voices: list[PoolVoice]) -> list[PoolVoice]:
    for before, voice in zip(voices, voices[1:]):
        if before.name == voice.name:
            raise ConfigError(
                f"speakers.pool: voice {voice.name!r} is defined twice ({before.where} and {voice.where})"
            )
    return voices


def _from_directory(root: Path) -> list[PoolVoice]:
    voices = []
    for audio in sorted(p for p in root.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()):
        transcripts = [audio.with_suffix(s) for s in TRANSCRIPT_SUFFIXES if audio.with_suffix(s).is_file()]
        if not transcripts:
            raise ConfigError(
                f"speakers.pool {root}: {audio.name} has no transcript beside it ({audio.with_suffix('.txt').name})"
            )
        name = audio.relative_to(root).with_suffix("").as_posix()
        text = transcripts[0].read_text(encoding="utf-8", errors="replace").strip()
        voices.append(_voice(name, str(audio.resolve()), text, str(transcripts[0])))
    return voices


def _from_jsonl(path: Path) -> list[PoolVoice]:
    voices = []
    for number, line in enumerate(_read(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"speakers.pool {path} line {number}: not JSON ({exc})") from None
        if not isinstance(entry, dict):
            raise ConfigError(f"speakers.pool {path} line {number}: must be an object with audio and text")
        voices.append(_entry(entry, path, f"{path.name} line {number}"))
    return voices


def _from_csv(path: Path) -> list[PoolVoice]:
    rows = csv.DictReader(_read(path).splitlines())
    missing = {"audio", "text"} - set(rows.fieldnames or ())
    if missing:
        raise ConfigError(
            f"speakers.pool {path}: its header row must name the columns audio and text "
            f"(and name); it has {rows.fieldnames}"
        )
    return [_entry(row, path, f"{path.name} line {number}") for number, row in enumerate(rows, 2)]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"speakers.pool {path} cannot be read: {exc}") from None


def _entry(entry: dict, manifest: Path, where: str) -> PoolVoice:
    audio, text = entry.get("audio"), entry.get("text")
    if not isinstance(audio, str) or not audio.strip():
        raise ConfigError(f"speakers.pool {where}: no audio path")
    if not isinstance(text, str):
        raise ConfigError(f"speakers.pool {where}: no text (the recording's transcript)")
    resolved = Path(audio) if Path(audio).is_absolute() else manifest.parent / audio
    name = entry.get("name") or Path(audio).stem
    if not isinstance(name, str):
        raise ConfigError(f"speakers.pool {where}: name must be a string")
    return _voice(name, str(resolved.resolve()), text, where)


def _voice(name: str, audio: str, text: str, where: str) -> PoolVoice:
    name = name.strip()
    if not name:
        raise ConfigError(f"speakers.pool {where}: the voice has an empty name")
    return PoolVoice(name, audio, text.strip(), where)


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
