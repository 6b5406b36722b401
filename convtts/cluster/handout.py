"""The Ray driver's book of shards and pieces: which slot opens a shard, which holds each piece, what comes back.

A shard is opened by one slot (the resume bookkeeping, before any piece of it is out), which says
which of its ids are left; the driver then cuts those into pieces for any slot that asks, from the
same window of open shards, longest first, as a slot cuts pieces for its workers
(convtts.run.window; the window's rows are those the running slots say they decode at once): rows
of close lengths then finish together and share the flow's passes, and the rows begun last, which
the end of a run waits for, are short.
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
import time
from collections import deque
from dataclasses import dataclass, field

from convtts.run.window import OpenShard, Window, piece_size, row_words
from convtts.state.layout import Layout
from convtts.state.shardio import read_json, read_jsonl

log = logging.getLogger("ray_engine")

MAX_SLOT_PIECE = 256  # ids: about what 8 workers of 32 rows hold at once
# A lost slot's pieces wait this long before another slot may take them: Ray may report a node
# dead a moment before the processes on it have noticed and exited (docs/ARCHITECTURE.md).
HANDBACK_GRACE = 5.0
# Pieces set aside for a slot that has not asked yet (at most its workers' first batch and look-ahead:
# its rows and a quarter more), kept this long before any slot may take them.
KEEP_FOR = 10.0


@dataclass
class HeldShard(OpenShard):
    """A shard the driver hands out: which of its pieces are not done (held, or coming back)."""

    out: set = field(default_factory=set)


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
        self.window = Window(layout, run_id)
        self.pieces: dict[int, PieceOut] = {}
        self.rechecks: deque[PieceOut] = deque()
        self.returning: list[tuple[float, str, object]] = []  # (when, "piece" or "open", the piece or shard)
        self.finished: set[str] = set()
        self.numbers = 0
        self.kept: dict[int | None, deque[PieceOut]] = {}  # set aside for a slot's first asking; None: anyone's
        self.served: set[int] = set()  # slots that have had a piece
        # rank -> (the rows it decodes at once, a worker's), as it said when it last asked
        self.sizes: dict[int, tuple[int, int]] = {}
        plan = read_json(layout.plan_file) or {}
        self.mean_segments = (plan.get("segments") or 0) / max(len(shards), 1)

    def remaining(self) -> int:
        """Ids still to hand out: the open shards' (pending or set aside) and an estimate for those not opened."""
        pending = self.window.pending() + self.kept_ids()
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
        """A slot's rows as it said; one that has not said counts as the mean of those that have (every
        slot says its rows when it asks, so the one asking has), and as one row while none has."""
        return self._size(rank, 0)

    def first_piece(self, rank: int) -> int:
        """The most a piece holds while some slot has had none: one worker's rows."""
        return self._size(rank, 1)

    def keep_ids(self, rank: int) -> int:
        rows = self.rows_of(rank)
        return rows + rows // 4

    def _size(self, rank: int, which: int) -> int:
        if rank in self.sizes:
            return self.sizes[rank][which]
        known = [size[which] for size in self.sizes.values()]
        return round(sum(known) / len(known)) if known else 1

    def hand_out(self, rank: int, ranks: list[int]) -> str:
        """The next piece (or recheck) for this slot, a shard for it to open (while the window is not
        full, or nothing else is left), or '' when none is left now. `ranks`: the slots running."""
        if self.rechecks:
            piece = self.rechecks.popleft()
            piece.holder = rank
            return f"recheck {piece.number} {piece.shard} {' '.join(piece.ids)}"
        slots = max(len(ranks), 1)
        rows = sum(self.rows_of(r) for r in ranks) or self.rows_of(rank)
        if self.unopened and self.window.wants_shard(self.remaining(), rows):
            return f"open {self.unopened.popleft()}"
        piece = self.take_kept(rank, stealing=self.window.pending() == 0)
        if piece is None:
            work = self.window.first_in_line()
            if work is None:
                return ""
            starting = any(r not in self.served for r in ranks if r != rank)
            piece = self.cut(work, slots, self.first_piece(rank) if starting else MAX_SLOT_PIECE)
            if starting:
                self.set_aside(rank, ranks, slots)
        return self.give(piece, rank)

    def cut(self, work: HeldShard, slots: int, most: int = MAX_SLOT_PIECE) -> PieceOut:
        """A piece of `work` from the window (convtts.run.window), held by no slot yet."""
        ids = self.window.take(work, piece_size(self.remaining(), slots, most))
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
            work = self.window.first_in_line()
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
        self.window.open[shard] = HeldShard(shard, segments, deque(ids), already, audio, words)

    def done(self, number: int, new: int, failed: int, audio: float) -> None:
        """Every id of piece `number` is in: the shard's stats once it was its last piece."""
        piece = self.pieces.pop(number, None)
        if piece is None:
            return  # a lost slot's late word about a piece already handed on
        work = self.window.open[piece.shard]
        work.new, work.failed, work.audio_seconds = work.new + new, work.failed + failed, work.audio_seconds + audio
        work.out.discard(number)
        if not work.pending and not work.out:
            self.window.close(work)
            self.finished.add(work.name)

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
        return idle and not any(s.pending for s in self.window.open.values())

    def left(self) -> bool:
        return bool(self.unopened or self.window.open or self.returning or self.rechecks)

    def held_ids(self) -> int:
        return sum(len(p.ids) for p in self.pieces.values() if p.holder is not None)

    def progress(self) -> str:
        return (
            f"shards {len(self.finished)}/{self.total} finished, {len(self.window.open)} open, "
            f"{len(self.unopened)} not opened, {self.held_ids()} utterances in pieces out"
        )
