"""The Ray driver's book of shards and pieces: which slot opens a shard, which holds each piece, what comes back.

A shard is opened by one slot (the resume bookkeeping, before any piece of it is out), which says
which of its ids are left; the driver then cuts those into pieces for any slot that asks, sized as
a slot cuts pieces for its workers (about the work left over twice the slots, smaller towards the
end). As a slot does with its own shards (convtts.run.pieces), the driver keeps a window of shards
open and hands their ids out longest first across it: rows of close lengths then finish together
and share the flow's passes, and the rows begun last, which the end of a run waits for, are short.
Handed out shard after shard instead, each longest first, a job of 1,000 conversations on two
H200s made 40% more flow passes than run_all.sh's slots and ran 20% slower in its steady state.

When every piece of a shard is done, the driver writes the shard's stats, once. A lost slot's
pieces go back in line after a grace period as rechecks: the slot that takes one first keeps the
ids the lost slot finished (a whole row and audio) and speaks the rest.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field

from convtts.run.pieces import MIN_PIECE, longest_next, row_words, take_longest, wants_shard
from convtts.state.layout import Layout
from convtts.state.shardio import read_json, read_jsonl, write_json_atomic

log = logging.getLogger("ray_engine")

MAX_SLOT_PIECE = 256  # ids: about what 8 workers of 32 rows hold at once
# The window: shards open at once hold WINDOW_BATCHES times this many ids a slot, every shard once
# the ids left fit OPEN_ALL_BATCHES times (convtts.run.pieces; this is about the rows
# one GPU slot decodes at once: 8 workers of 96 on an H200; the driver does not know the slots' rows).
SLOT_ROWS = 768
# A lost slot's pieces wait this long before another slot may take them: Ray may report a node
# dead a moment before the processes on it have noticed and exited (docs/ARCHITECTURE.md).
HANDBACK_GRACE = 5.0


@dataclass
class OpenShard:
    name: str
    segments: int
    already: int  # spoken before this run opened it
    audio: float
    pending: deque
    words: dict = field(default_factory=dict)  # each id's words (the plan's count): its length, roughly
    out: set = field(default_factory=set)  # numbers of its pieces not done (held, or coming back)
    new: int = 0
    failed: int = 0
    pieces: int = 0
    started: float = field(default_factory=time.time)

    def stats(self, run_id: str) -> dict:
        return {
            "shard": self.name,
            "segments": self.segments,
            "done": self.already + self.new,
            "failed": self.failed,
            "pending": len(self.pending),
            "new": self.new,
            "pieces": self.pieces,
            "audio_seconds": round(self.audio, 3),
            "seconds": round(time.time() - self.started, 3),
            "run": run_id,
        }


@dataclass
class PieceOut:
    number: int
    shard: str
    ids: list
    holder: int | None  # the slot's rank; None while it waits to go out again


class Book:
    """Shards to open, open shards' ids, pieces out, and what lost slots held."""

    def __init__(self, layout: Layout, shards: list[str], run_id: str):
        self.layout, self.run_id = layout, run_id
        self.unopened = deque(shards)
        self.total = len(shards)
        self.open: dict[str, OpenShard] = {}
        self.pieces: dict[int, PieceOut] = {}
        self.rechecks: deque[PieceOut] = deque()
        self.returning: list[tuple[float, str, object]] = []  # (when, "piece" or "open", the piece or shard)
        self.finished: set[str] = set()
        self.numbers = 0
        plan = read_json(layout.plan_file) or {}
        self.mean_segments = (plan.get("segments") or 0) / max(len(shards), 1)

    def remaining(self) -> int:
        """Ids still to hand out: the open shards' and an estimate for those not opened."""
        return sum(len(s.pending) for s in self.open.values()) + round(len(self.unopened) * self.mean_segments)

    def hand_out(self, rank: int, slots: int) -> str:
        """The next piece (or recheck) for this slot, a shard for it to open (while the window is not
        full, or nothing else is left), or '' when none is left now."""
        if self.rechecks:
            piece = self.rechecks.popleft()
            piece.holder = rank
            return f"recheck {piece.number} {piece.shard} {' '.join(piece.ids)}"
        pending = sum(len(s.pending) for s in self.open.values())
        if self.unopened and wants_shard(pending, self.remaining(), SLOT_ROWS * max(slots, 1)):
            return f"open {self.unopened.popleft()}"
        work = longest_next(self.open.values())  # the oldest on a tie
        if work is not None:
            return self.cut(work, rank, slots)
        return ""

    def cut(self, work: OpenShard, rank: int, slots: int) -> str:
        """A piece of `work`: its ids no shorter than the next id of any other open shard (at least
        MIN_PIECE), so the window goes out longest first; no runt left behind."""
        size = max(MIN_PIECE, min(MAX_SLOT_PIECE, math.ceil(self.remaining() / (2 * max(slots, 1)))))
        ids = take_longest(self.open.values(), work, size, lambda shard, uid: shard.words.get(uid, 0))
        self.numbers += 1
        self.pieces[self.numbers] = PieceOut(self.numbers, work.name, ids, rank)
        work.out.add(self.numbers)
        work.pieces += 1
        return f"piece {self.numbers} {work.name} {' '.join(ids)}"

    def opened(self, shard: str, segments: int, already: int, audio: float, ids: list[str]) -> None:
        """A slot opened `shard`: these ids are left (none: it is finished, its stats written by that slot)."""
        if not ids:
            self.finished.add(shard)
            return
        words = row_words(read_jsonl(self.layout.shard_file(shard)))
        self.open[shard] = OpenShard(shard, segments, already, audio, deque(ids), words)

    def done(self, number: int, new: int, failed: int, audio: float) -> None:
        """Every id of piece `number` is in: the shard's stats once it was its last piece."""
        piece = self.pieces.pop(number, None)
        if piece is None:
            return  # a lost slot's late word about a piece already handed on
        work = self.open[piece.shard]
        work.new, work.failed, work.audio = work.new + new, work.failed + failed, work.audio + audio
        work.out.discard(number)
        if not work.pending and not work.out:
            write_json_atomic(self.layout.stats(work.name), work.stats(self.run_id))  # last: the done marker
            del self.open[work.name]
            self.finished.add(work.name)
            log.info(
                "%s finished: %d of %d spoken (%d now, in %d pieces), %d failed",
                work.name,
                work.already + work.new,
                work.segments,
                work.new,
                work.pieces,
                work.failed,
            )

    def held_by(self, rank: int) -> list[PieceOut]:
        return [p for p in self.pieces.values() if p.holder == rank]

    def give_back(self, rank: int, opening: str | None) -> tuple[int, int]:
        """A lost slot's pieces and the shard it was opening go back in line after the grace period;
        returns (pieces, ids)."""
        when = time.time() + HANDBACK_GRACE
        held = self.held_by(rank)
        for piece in held:
            piece.holder = None
            self.returning.append((when, "piece", piece))
        if opening is not None:
            self.returning.append((when, "open", opening))
        return len(held), sum(len(p.ids) for p in held)

    def release_returning(self) -> None:
        now = time.time()
        for entry in [e for e in self.returning if e[0] <= now]:
            self.returning.remove(entry)
            _, kind, item = entry
            if kind == "piece":
                self.rechecks.append(item)
            else:
                self.unopened.appendleft(item)  # first in line again

    def busy(self) -> bool:
        """Something is out that may yet come back (a slot holds pieces or is opening a shard, or a lost slot's are
        due)."""
        return bool(self.returning or self.rechecks or any(p.holder is not None for p in self.pieces.values()))

    def all_out(self) -> bool:
        """Every id is handed out: nothing to open or hand out, nothing of a lost slot's due."""
        idle = not (self.unopened or self.returning or self.rechecks)
        return idle and not any(s.pending for s in self.open.values())

    def left(self) -> bool:
        return bool(self.unopened or self.open or self.returning or self.rechecks)

    def held_ids(self) -> int:
        return sum(len(p.ids) for p in self.pieces.values() if p.holder is not None)
