"""A voice pool on disk (speakers.pool): its voices' names, recordings and transcripts, for the plan's
casting and the voices that speak from prompts.

A pool is one of:
- a directory: each audio file (.wav, .flac, .ogg, .mp3) with its transcript beside it in a .txt
  (or .lab) file of the same name; the voice's name is the file name without its extension, and
  files in subdirectories are named by their relative path (`en/anna`);
- a JSON-lines manifest (.jsonl): one `{"name": "anna", "audio": "prompts/anna.wav", "text": "..."}`
  a line, `name` optional (the audio file's name without its extension), `language` optional (the
  language the voice speaks, for speakers.by_language), `mode` and `instruct` optional (how it is
  spoken, as a voice of tts.cosyvoice.prompts: a cross-lingual or instruct voice needs no `text`);
- a CSV manifest (.csv) with a header row holding at least `audio` and `text` (and `name`,
  `language`, `mode`, `instruct`).
Relative audio paths are read from the manifest's folder. The voices are kept sorted by name, so the
order of the lines does not change which conversation gets which voice. Reading a pool checks its
structure (every voice has a transcript, no name twice); the backend checks the recordings.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import orjson

from convtts.config import PROMPT_MODES, ConfigError

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
TRANSCRIPT_SUFFIXES = (".txt", ".lab")


@dataclass(frozen=True)
class PoolVoice:
    name: str
    audio: str  # the recording's path, absolute
    text: str  # its transcript
    where: str  # where the pool defines it, for error messages: 'voices.jsonl line 17'
    language: str = ""  # the language it speaks (a manifest's `language`), for speakers.by_language; "": any
    mode: str = (
        "zero_shot"  # how it is spoken, as a prompt's (convtts.config.PromptVoice): zero_shot, cross_lingual, instruct
    )
    instruct: str = ""


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
    mode, instruct = entry.get("mode") or "zero_shot", entry.get("instruct") or ""
    if not isinstance(audio, str) or not audio.strip():
        raise ConfigError(f"speakers.pool {where}: no audio path")
    if mode not in PROMPT_MODES or not isinstance(instruct, str):
        raise ConfigError(f"speakers.pool {where}: mode must be one of {PROMPT_MODES} and instruct a string")
    if text is None and mode != "zero_shot":
        text = ""  # a cross-lingual or instruct voice has no use for its transcript
    if not isinstance(text, str):
        raise ConfigError(f"speakers.pool {where}: no text (the recording's transcript)")
    resolved = Path(audio) if Path(audio).is_absolute() else manifest.parent / audio
    name = entry.get("name") or Path(audio).stem
    if not isinstance(name, str):
        raise ConfigError(f"speakers.pool {where}: name must be a string")
    language = entry.get("language") or ""
    if not isinstance(language, str):
        raise ConfigError(f"speakers.pool {where}: language must be a string such as zh or en")
    voice = _voice(name, str(resolved.resolve()), text, where)
    return PoolVoice(voice.name, voice.audio, voice.text, where, language.strip().lower(), mode, instruct.strip())


def _voice(name: str, audio: str, text: str, where: str) -> PoolVoice:
    name = name.strip()
    if not name:
        raise ConfigError(f"speakers.pool {where}: the voice has an empty name")
    return PoolVoice(name, audio, text.strip(), where)
