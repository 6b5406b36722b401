"""What a slot and its workers say to each other over their pipe: one small dataclass per message.

Worker to slot: Ready once its model is up (with where its start-up time went), Want when its
queue of ids runs low (both with its room: how many ids it takes, 0 for no bound), per utterance
Started and Spoken or Failed (and Requeued when a begun one goes back in its queue to be tried
again), Built at every model load, Returned in answer to HandBack, DiskFull when it had to stop.
Slot to worker: SpeakPiece (a piece of a shard), Nothing (no ids now: ask again once idle),
HandBack (give back ids not begun yet: an idle worker will speak them), or Stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Ready:
    wid: int
    phases: dict = field(default_factory=dict)  # start-up seconds by phase (see worker.StartupClock)
    room: int = 0  # ids it may take for its first piece (0: as many as the slot cuts)


@dataclass(frozen=True)
class Want:
    room: int = 0  # ids it may take (0: as many as the slot cuts)


@dataclass(frozen=True)
class Started:
    uid: str


@dataclass(frozen=True)
class Requeued:
    uid: str  # begun, and back in the worker's queue for another attempt: it may be handed back again


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
    phases: dict = field(default_factory=dict)  # the load's own phases: modules, weights, frontend ...
    weights: str = ""  # digest of the loaded parameters: every worker of a slot must hold the same


@dataclass(frozen=True)
class Returned:
    ids: tuple  # ids of the worker's queue it had not begun, now the slot's again
    errors: dict = field(default_factory=dict)  # of those tried before, the error of each attempt spent


@dataclass(frozen=True)
class DiskFull:
    what: str  # which write failed, for the slot's log


@dataclass(frozen=True)
class SpeakPiece:
    shard: str
    ids: list[str]
    crashes: dict[str, int] = field(default_factory=dict)  # deaths of a worker on an id in this run
    errors: dict[str, tuple] = field(default_factory=dict)  # errors of attempts spent on an id a worker handed back


@dataclass(frozen=True)
class Nothing:
    pass


@dataclass(frozen=True)
class HandBack:
    count: int  # at most this many, from the end of the queue


@dataclass(frozen=True)
class Stop:
    pass
