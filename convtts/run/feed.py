"""Pieces of shards handed to a slot by a driver (the Ray engine), instead of a fixed share of shards.

The slot writes requests on one pipe and reads answers on another, a line each:

    slot -> driver: "next ROWS WORKER_ROWS"                it has no ids left to hand its workers;
                                                           they decode ROWS at once, WORKER_ROWS each
                    "opened shard-00042 SEGS DONE AUDIO ID..." it opened the shard it was told to (the
                                                           resume bookkeeping); these ids are left to
                                                           speak (none: it wrote the shard's stats)
                    "done 17 NEW FAILED AUDIO"             every id of piece 17 is spoken or failed
    driver -> slot: "piece 17 shard-00042 ID..."           speak these ids
                    "recheck 18 shard-00042 ID..."         the same, for ids a lost slot held: speak
                                                           only those without a whole row yet
                    "open shard-00042"                     open this shard and say what is left in it
                    "wait 0.25"                            nothing now, but ids held elsewhere may
                                                           come back: ask again in 0.25 s (a plain
                                                           "wait": in a second)
                    "wait 0.25 ending"                     the same, and every id is out: only a lost
                                                           slot's could come back (the slot stops its
                                                           idle workers but one)
                    ""                                     nothing is left: stop when the work in hand is done

"opened" asks for the next answer too; "done" gets none. A closed pipe reads as "": a driver that
is gone hands out nothing more. The driver writes a shard's stats once every piece of it is done.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from convtts.run.pieces import Piece, cut_size, keep_errors, new_piece, open_shard, remove_temporaries_of
from convtts.run.window import longest_next, row_words
from convtts.state.layout import Layout, WorkListing
from convtts.state.shardio import append_line, load_done, read_jsonl, shard_complete_and_whole, write_marker

log = logging.getLogger(__name__)

WAIT, ENDING = "wait", "ending"
ASK_EVERY = 1.0  # seconds to the next ask after a plain "wait"; the driver says how long, by how many slots ask
ASK_BOUNDS = (0.05, 5.0)  # what a slot takes of the driver's "wait SECONDS"


class ShardFeed:
    def __init__(self, read_fd: int, write_fd: int):
        self.answers = os.fdopen(read_fd, "r")
        self.requests = os.fdopen(write_fd, "w", buffering=1)
        self.exhausted = False
        self.ask_at = 0.0  # after a "wait": not before this time
        self.ending = False  # the last "wait" said every id is out

    def next(self, rows: int, worker_rows: int) -> list[str] | None:
        """The driver's next answer, split in words; None for now (after a "wait") or for good (`exhausted`)."""
        if self.exhausted or time.time() < self.ask_at:
            return None
        return self.answer(self.ask(f"next {rows} {worker_rows}"))

    def retry_in(self) -> float:
        """Seconds until the slot may ask again after a "wait"; 0 when it may now."""
        return max(0.0, self.ask_at - time.time())

    def opened(self, shard: str, segments: int, already: int, audio: float, ids: list[str]) -> list[str] | None:
        """Say what is left in a shard this slot opened; returns the driver's next answer, as next() does."""
        return self.answer(self.ask(f"opened {shard} {segments} {already} {audio:.3f} {' '.join(ids)}".rstrip()))

    def done(self, number: int, new: int, failed: int, audio: float) -> None:
        self.send(f"done {number} {new} {failed} {audio:.3f}")

    def answer(self, line: str) -> list[str] | None:
        words = line.split()
        waiting = words[:1] == [WAIT]
        self.ending = waiting and ENDING in words[2:]
        if waiting:
            self.ask_at = time.time() + wait_seconds(words)
            return None
        if not words:
            self.exhausted = True
            return None
        return words

    def ask(self, request: str) -> str:
        if not self.send(request):
            return ""
        return self.answers.readline().strip()

    def send(self, line: str) -> bool:
        try:
            self.requests.write(line + "\n")
            return True
        except (BrokenPipeError, ValueError):  # the driver is gone
            self.exhausted = True
            return False


def wait_seconds(words: list[str]) -> float:
    """How long a "wait" answer says to wait: its number, within ASK_BOUNDS; a second without one."""
    try:
        seconds = float(words[1])
    except (IndexError, ValueError):
        return ASK_EVERY
    if not math.isfinite(seconds):
        return ASK_EVERY
    return min(max(seconds, ASK_BOUNDS[0]), ASK_BOUNDS[1])


@dataclass
class DriverPiece:
    """A piece the driver handed this slot: done once each id is spoken or failed."""

    number: int
    shard: str
    left: set
    new: int = 0
    failed: int = 0
    audio: float = 0.0


@dataclass
class FedShard:
    """A shard some of whose ids this slot holds: the ids not yet handed to a worker, and their words."""

    name: str
    pending: deque = field(default_factory=deque)
    words: dict = field(default_factory=dict)
    crashes: Counter = field(default_factory=Counter)
    errors: dict = field(default_factory=dict)  # ids a worker tried and handed back: the error of each attempt


class FedWork:
    """A fed slot's work, as WorkQueue's for a slot with its own shards: pieces from the driver, cut
    again for the workers. The driver owns the shards: it writes their stats, and hands what a
    lost slot held to another as a recheck."""

    def __init__(self, layout: Layout, run_id: str, writer: str, feed: ShardFeed, workers: int, verify: bool = False):
        self.layout, self.run_id, self.writer, self.feed, self.workers = layout, run_id, writer, feed, workers
        self.verify = verify  # open every audio file of a shard marked done (--verify), not trust its marker
        self.rows = 1
        self.shards: dict[str, FedShard] = {}
        self.owner: dict[str, DriverPiece] = {}  # id -> the driver's piece it came in
        self.total = 0
        self.todo_words = self.done_words = 0.0
        self.mean_words = 0.0
        self.taken: list[str] = []  # fed slots own no shards
        # work/ as this run began: a shard is opened once a run, before any piece of it goes out, so
        # no writer of this run has touched it when it is opened (a lost slot's rechecks list again)
        self.listing = WorkListing(layout)

    def remaining(self) -> int:
        return sum(len(s.pending) for s in self.shards.values())

    def has_work(self) -> bool:
        return not self.feed.exhausted or self.remaining() > 0

    def pending_counts(self) -> list[int]:
        return [len(s.pending) for s in self.shards.values()]

    def next_piece(self, room: int = 0) -> Piece | None:
        # its longest fed shard first, as the driver hands them out
        work = longest_next(self.shards.values()) or self.ask_driver()
        if work is None:
            return None
        size = cut_size(len(work.pending), self.remaining(), self.workers, self.rows, room)
        ids = [work.pending.popleft() for _ in range(size)]
        return new_piece(work, ids)

    def ask_driver(self) -> FedShard | None:
        """Ask until the driver hands out ids (opening shards as it says), waits, or has nothing left."""
        answer = self.ask()
        while answer:
            kind = answer[0]
            if kind == "open" and len(answer) == 2:
                answer = self.open(answer[1])
                continue
            if kind in ("piece", "recheck") and len(answer) >= 3:
                work = self.take(int(answer[1]), answer[2], answer[3:], recheck=kind == "recheck")
                if work is not None:
                    return work
                answer = self.ask()
                continue
            log.warning("the driver said something unexpected: %r", " ".join(answer)[:200])
            answer = self.ask()
        return None

    def ask(self) -> list[str] | None:
        """The driver's next answer to "next", which says the rows this slot's workers decode at once."""
        return self.feed.next(self.workers * self.rows, self.rows)

    def open(self, shard: str) -> list[str] | None:
        """The resume point of a shard, as a slot with its own shards makes it; the driver gets what is left."""
        manifests = self.listing.manifests(shard)
        if shard_complete_and_whole(self.layout, shard, self.listing, self.verify):  # logs any damage it finds
            rows = read_jsonl(self.layout.shard_file(shard))
            return self.feed.opened(shard, len(rows), len(rows), 0.0, [])
        work = open_shard(self.layout, shard, self.run_id, manifests)
        if not work.pending:  # every id has a whole row: the shard needs only its stats
            write_marker(self.layout, shard, work.stats(self.run_id), manifests)
        return self.feed.opened(shard, work.segments, work.already, work.audio_seconds, list(work.pending))

    def take(self, number: int, shard: str, ids: list[str], recheck: bool) -> FedShard | None:
        """A piece from the driver: its ids join this slot's pending ids of the shard."""
        piece = DriverPiece(number, shard, set(ids))
        if recheck:  # a lost slot held them: what it finished is kept
            done = load_done(self.layout, shard)
            for uid in [uid for uid in ids if uid in done]:
                piece.left.discard(uid)
                piece.new += 1
                piece.audio += done[uid]["duration"]
            ids = [uid for uid in ids if uid not in done]
            log.info(
                "piece %d of %s (a lost slot's): %d already spoken, %d to speak", number, shard, piece.new, len(ids)
            )
        if not ids:
            self.feed.done(number, piece.new, piece.failed, piece.audio)
            return None
        work = self.shards.setdefault(shard, FedShard(shard))
        if not work.words:
            work.words = row_words(read_jsonl(self.layout.shard_file(shard)))
        work.pending.extend(ids)
        for uid in ids:
            self.owner[uid] = piece
        self.total += len(ids)
        self.todo_words += sum(work.words.get(uid, 0) for uid in ids)
        return work

    def reported(self, piece: Piece, uid: str, ok: bool, audio_seconds: float) -> None:
        piece.reported.add(uid)
        self.shards[piece.shard].errors.pop(uid, None)
        self.done_words += self.shards[piece.shard].words.get(uid, 0)
        owner = self.owner.pop(uid, None)
        if owner is None:
            return
        owner.left.discard(uid)
        owner.new += ok
        owner.failed += not ok
        owner.audio += audio_seconds
        if not owner.left:
            self.feed.done(owner.number, owner.new, owner.failed, owner.audio)

    def returned(self, piece: Piece, ids: list[str], errors: dict | None = None) -> None:
        ids = [uid for uid in piece.unstarted() if uid in set(ids)]
        piece.returned.update(ids)
        keep_errors(self.shards[piece.shard], ids, errors)
        self.shards[piece.shard].pending.extendleft(reversed(ids))

    def worker_died(self, piece: Piece, exitcode: int | None, pid: int, tag: str = "") -> list[str]:
        """As WorkQueue.worker_died, with a crashes file of this slot's own (several slots write pieces of a shard)."""
        charged = piece.in_flight()
        work = self.shards[piece.shard]
        for uid in charged:
            append_line(
                self.layout.crashes(piece.shard, self.writer),
                {"id": uid, "run": self.run_id, "exitcode": exitcode, "time": time.time()},
            )
            work.crashes[uid] += 1
        remove_temporaries_of(self.layout, piece.shard, pid, tag)
        back = piece.unreported()
        piece.returned.update(back)
        work.pending.extendleft(reversed(back))
        return charged
