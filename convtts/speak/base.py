"""The whole contract between a voice and the run stage: what a backend must provide, what it may.

A backend is a class deriving from `Backend` (one utterance at a time) or `BatchedBackend` (many
at once); `run/` reads nothing of it that is not declared here. Before any worker starts, the slot
asks the class for its `Resources` (rows, memory, weights, how its workers start) and the config
its workers get once sized (`sized`); each worker then builds an instance and calls it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from convtts.errors import OutOfMemory, SynthesisError, is_out_of_memory

if TYPE_CHECKING:
    from convtts.config import Config

# The errors a voice raises are part of its contract; they live below every stage (convtts/errors.py).
__all__ = [
    "FEED_WAIT",
    "Backend",
    "BatchedBackend",
    "OutOfMemory",
    "Preload",
    "Resources",
    "SynthesisError",
    "is_out_of_memory",
]

# What a batched backend's feed may yield in place of an item: nothing now, ask again after the next step
# (a worker holding its first batch, run/batching.py). Only a backend with `feed_may_wait` set is given it.
FEED_WAIT = object()


@dataclass(frozen=True)
class Preload:
    """What a slot's forkserver imports once for all its workers (run/preload.py): `function`, a
    "package.module:function" of the voice's own, is called there as function(args, phase), where
    `phase(name)` times a step for the slot's log. `args` must be JSON."""

    function: str
    args: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Resources:
    """What a slot needs of a voice before any worker loads it: its answer to `Backend.resources`."""

    rows: int = 1  # utterances a worker speaks at once; 0: the slot picks them from the GPU's memory
    rows_with_room: int = 0  # rows a worker takes instead where the GPU's memory holds them; 0: never
    row_mb: float = 0.0  # GPU MiB a row takes at its peak, for rows the slot picks
    row_held_mb: float = 0.0  # GPU MiB a row holds all run long (a static KV cache)
    pass_mb: int = 0  # MiB one pass over the rows may take at most, which the slot may shrink; 0: not sized
    weights: tuple[Path, ...] = ()  # files a load reads, read ahead into the page cache by the slot
    start_method: str = "spawn"  # how workers start when workers.start_method is auto
    preload: Preload | None = None  # what a forkserver imports for them

    @property
    def passes(self) -> tuple[float, int] | None:
        """(MiB each row holds, MiB a pass may take) where the voice sizes its passes, else None."""
        return (self.row_held_mb, self.pass_mb) if self.pass_mb else None


class Backend(ABC):
    """A loaded voice model inside one worker process.

    Built once per worker (and again at every rebuild) from the Config; `synthesize` is called once
    per utterance. Everything but `name`, `sample_rate` and `synthesize` has a default.
    """

    name: str  # written to the manifest's `backend` field
    sample_rate: int
    # ISO 639-1 codes the voice speaks, for the plan (convtts.speak.voice_languages); None: any
    languages: ClassVar[Iterable[str] | None] = None
    batch_rows: int = 1  # utterances one call decodes at once: more than 1 only on a BatchedBackend
    load_phases: Mapping[str, float] = MappingProxyType({})  # seconds of the last load, by step

    @staticmethod
    def check(config: Config) -> None:
        """Raise ConfigError where this voice cannot run with `config`, before any worker starts."""
        return None

    @classmethod
    def resources(cls, config: Config, device: str) -> Resources:
        """What a worker of this voice needs on `device` ("cpu" or "cuda"): one row, no GPU sizing, spawned."""
        return Resources()

    @staticmethod
    def sized(config: Config, rows: int, pass_mb: int = 0) -> Config:
        """The config a slot's workers get once it has chosen their `rows` and pass budget (0: as it was)."""
        return config

    @abstractmethod
    def synthesize(self, text: str, speaker: str, seed: int) -> np.ndarray:
        """Return mono float32 samples in [-1, 1] for `text` spoken by `speaker`.

        `seed` makes the utterance reproducible whatever happened before it in the process.
        """

    def close(self) -> None:
        """Drop every reference to the model so its memory can be reclaimed."""
        return None

    def weights_digest(self) -> str:
        """A digest of the weights this load holds: every worker of a slot must hold the same; '' for none."""
        return ""

    def gpu_memory_mb(self, kind: str = "reserved") -> float:
        """This process's GPU memory in MiB (`allocated` or `reserved`); 0 for a voice without a GPU."""
        return 0.0

    def prompt_audio(self, speaker: str) -> str | None:
        """The recording a zero-shot voice speaks from, for the manifest; None for any other."""
        return None


class BatchedBackend(Backend):
    """A backend that also speaks many utterances at once, as rows of one decode."""

    feed_may_wait: bool = False  # synthesize_many's items may hold FEED_WAIT

    @abstractmethod
    def synthesize_many(self, items: Iterable) -> Iterator[tuple[object, np.ndarray | BaseException]]:
        """Speak (key, text, speaker, seed) items, read lazily as rows free up, at most `batch_rows` at
        once; yield (key, audio) or (key, exception) per item as soon as it is final. OutOfMemory
        propagates: the items handed over and not yet yielded are the caller's to retry."""

    @abstractmethod
    def shrink_batch(self) -> int:
        """Halve the rows after an out-of-memory; return the new count."""

    def grow_batch(self) -> int:
        """Double the rows a shrink cut, up to those it was built with; return the new count (default: no growth)."""
        return self.batch_rows
