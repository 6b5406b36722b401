"""The Ray driver's book of shards and pieces: which slot opens a shard, which holds each piece, what comes back.

A shard is opened by one slot (the resume bookkeeping, before any piece of it is out), which says
which of its ids are left; the driver then cuts those into pieces for any slot that asks, sized as
a slot cuts pieces for its workers (about the work left over twice the slots, smaller towards the
end). As a slot does with its own shards (convtts.run.pieces), the driver keeps a window of shards
open and hands their ids out longest first across it: rows of close lengths then finish together
and share the flow's passes, and the rows begun last, which the end of a run waits for, are short.
Handed out shard after shard instead, each longest first, a job of 1,000 conversations on two
H200s made 40% more flow passes than run_all.sh's slots and ran 20% slower in its steady state.

Slots come up a second or two apart, and the first one's workers would take the longest ids of the
run before the others asked: its rows then outlived every other slot's (on two H200s the last rows
of a Ray run were that slot's, ending 11 s after the first worker ran out, against 4.5 s for
run_all.sh's fixed halves). So until a slot has had its first piece, each piece cut for another
slot is matched by the next-longest one set aside for it (up to about its workers' first batch),
and it gets those first: every slot begins with rows of the same mix of lengths, as run_all.sh's
do. A piece set aside goes to anyone once its slot is lost or has not asked for KEEP_FOR seconds,
and before any new cut, being among the longest.

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
from convtts.state.shardio import read_json, read_jsonl, write_marker

log = logging.getLogger("ray_engine")

MAX_SLOT_PIECE = 256  # ids: about what 8 workers of 32 rows hold at once
# The window: shards open at once hold WINDOW_BATCHES times the rows the running slots decode at
# once, every shard once the ids left fit OPEN_ALL_BATCHES times (convtts.run.pieces). Each slot says
# its rows and a worker's when it asks; until one has, a slot counts as SLOT_ROWS (8 workers of 96).
SLOT_ROWS = 768
# A lost slot's pieces wait this long before another slot may take them: Ray may report a node
# dead a moment before the processes on it have noticed and exited (docs/ARCHITECTURE.md).
HANDBACK_GRACE = 5.0
# Pieces set aside for a slot that has not asked yet: at most its workers' first batch and look-ahead
# (its rows and a quarter more), kept this long before any slot may take them.
KEEP_IDS = SLOT_ROWS + SLOT_ROWS // 4
KEEP_FOR = 10.0
FIRST_PIECE = SLOT_ROWS // 8  # the most a piece holds while some slot has had none: one worker's rows


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
    holder: int | None  # the slot's rank; None while it waits to go out (again, or set aside)
    kept_since: float = 0.0  # when it was set aside for a slot's first asking (holder None)


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
        self.kept: dict[int | None, deque[PieceOut]] = {}  # set aside for a slot's first asking; None: anyone's
        self.served: set[int] = set()  # slots that have had a piece
        self.sizes: dict[int, tuple[int, int]] = {}  # rank -> (the rows it decodes at once, a worker's), as it said
        plan = read_json(layout.plan_file) or {}
        self.mean_segments = (plan.get("segments") or 0) / max(len(shards), 1)

    def remaining(self) -> int:
        """Ids still to hand out: the open shards' (pending or set aside) and an estimate for those not opened."""
        pending = sum(len(s.pending) for s in self.open.values()) + self.kept_ids()
        return pending + round(len(self.unopened) * self.mean_segments)

    def kept_ids(self) -> int:
        """Ids in pieces set aside, for any slot."""
        return sum(len(piece.ids) for queue in self.kept.values() for piece in queue)

    def kept_for(self, rank: int) -> int:
        return sum(len(piece.ids) for piece in self.kept.get(rank, ()))

    def sized(self, rank: int, rows: int, worker_rows: int) -> None:
        """What a slot said it decodes at once: all its workers' rows, and one worker's."""
        if rows > 0 and worker_rows > 0:
            self.sizes[rank] = (rows, worker_rows)

    def rows_of(self, rank: int) -> int:
        """A slot's rows as it said; one that has not said counts as the mean of those that have."""
        return self._size(rank, 0, SLOT_ROWS)

    def first_piece(self, rank: int) -> int:
        return self._size(rank, 1, FIRST_PIECE)

    def keep_ids(self, rank: int) -> int:
        rows = self.rows_of(rank)
        return rows + rows // 4 if self.sizes else KEEP_IDS

    def _size(self, rank: int, which: int, default: int) -> int:
        if rank in self.sizes:
            return self.sizes[rank][which]
        known = [size[which] for size in self.sizes.values()]
        return round(sum(known) / len(known)) if known else default

    def hand_out(self, rank: int, ranks: list[int]) -> str:
        """The next piece (or recheck) for this slot, a shard for it to open (while the window is not
        full, or nothing else is left), or '' when none is left now. `ranks`: the slots running."""
        if self.rechecks:
            piece = self.rechecks.popleft()
            piece.holder = rank
            return f"recheck {piece.number} {piece.shard} {' '.join(piece.ids)}"
        slots = max(len(ranks), 1)
        pending = sum(len(s.pending) for s in self.open.values())
        rows = sum(self.rows_of(r) for r in ranks) or self.rows_of(rank)
        if self.unopened and wants_shard(pending, self.remaining(), rows):
            return f"open {self.unopened.popleft()}"
        piece = self.take_kept(rank, stealing=pending == 0)
        if piece is None:
            work = longest_next(self.open.values())  # the oldest on a tie
            if work is None:
                return ""
            starting = any(r not in self.served for r in ranks if r != rank)
            piece = self.cut(work, slots, self.first_piece(rank) if starting else MAX_SLOT_PIECE)
            if starting:
                self.set_aside(rank, ranks, slots)
        return self.give(piece, rank)

    def cut(self, work: OpenShard, slots: int, most: int = MAX_SLOT_PIECE) -> PieceOut:
        """A piece of `work`, held by no slot yet: its ids no shorter than the next id of any other
        open shard (at least MIN_PIECE), so the window goes out longest first; no runt left behind."""
        size = max(MIN_PIECE, min(most, math.ceil(self.remaining() / (2 * slots))))
        ids = take_longest(self.open.values(), work, size, lambda shard, uid: shard.words.get(uid, 0))
        self.numbers += 1
        piece = self.pieces[self.numbers] = PieceOut(self.numbers, work.name, ids, None)
        work.out.add(self.numbers)
        work.pieces += 1
        return piece

    def give(self, piece: PieceOut, rank: int) -> str:
        piece.holder = rank
        self.served.add(rank)
        return f"piece {piece.number} {piece.shard} {' '.join(piece.ids)}"

    def set_aside(self, rank: int, ranks: list[int], slots: int) -> None:
        """After a cut for `rank`: the next-longest piece for each running slot that has not had one,
        while what is set aside for it holds fewer than its keep_ids (the slots' first pieces alternate)."""
        for other in ranks:
            if other == rank or other in self.served or self.kept_for(other) >= self.keep_ids(other):
                continue
            work = longest_next(self.open.values())
            if work is None:
                return
            piece = self.cut(work, slots, self.first_piece(other))
            piece.kept_since = time.time()
            self.kept.setdefault(other, deque()).append(piece)

    def take_kept(self, rank: int, stealing: bool) -> PieceOut | None:
        """A piece set aside for this slot; else one kept for a lost slot or kept past KEEP_FOR; else,
        `stealing` (nothing else is left to cut), any piece set aside."""
        stale = time.time() - KEEP_FOR
        for owner in [rank, None] + [r for r in self.kept if r not in (rank, None)]:
            queue = self.kept.get(owner)
            if queue and (owner in (rank, None) or stealing or queue[0].kept_since <= stale):
                return queue.popleft()
        return None

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
            write_marker(self.layout, work.name, work.stats(self.run_id))  # last: the done marker
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
        self.kept.setdefault(None, deque()).extend(self.kept.pop(rank, ()))  # never handed to it: anyone's now
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
        idle = not (self.unopened or self.returning or self.rechecks or self.kept_ids())
        return idle and not any(s.pending for s in self.open.values())

    def left(self) -> bool:
        return bool(self.unopened or self.open or self.returning or self.rechecks)

    def held_ids(self) -> int:
        return sum(len(p.ids) for p in self.pieces.values() if p.holder is not None)
