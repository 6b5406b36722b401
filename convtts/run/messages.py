"""What a slot and its workers say to each other over their pipe: one small dataclass per message.

Worker to slot: Ready once its model is up, then per utterance Started and Spoken or Failed,
Built at every model load, PieceDone when a piece is finished, DiskFull when it had to stop.
Slot to worker: SpeakPiece (a piece of a shard) or Stop.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Ready:
    wid: int


@dataclass(frozen=True)
class Started:
    uid: str


@dataclass(frozen=True)
class Spoken:
    uid: str
    audio_seconds: float


@dataclass(frozen=True)
class Failed:
    uid: str
    reason: str


@dataclass(frozen=True)
class Built:
    reason: str
    seconds: float
    rss_mb: float
    gpu_mb: float


@dataclass(frozen=True)
class PieceDone:
    shard: str
    count: int


@dataclass(frozen=True)
class DiskFull:
    shard: str
    what: str


@dataclass(frozen=True)
class SpeakPiece:
    shard: str
    ids: list[str]
    crashes: dict[str, int] = field(default_factory=dict)  # deaths of a worker on an id in this run


@dataclass(frozen=True)
class Stop:
    pass
