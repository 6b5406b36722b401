"""A slot's unit of work: a piece, a run of one shard's not-yet-spoken ids, sized so no worker idles.

A worker asks for more before its queue runs dry and gets the next piece. Sizes follow guided
self-scheduling: a piece holds about the work left divided by twice the workers, so a big run hands
out pieces of MAX_PIECE and the last ones hold MIN_PIECE ids. One shard of 100 ids on 4 workers is
cut 13, 11, 10, 9, 8, 7, 6, 5, 4, 4, 3, 3, 3 and seven pieces of 2. A batched worker says how many
it takes (its free rows and an eighth more): the ids it could not begin yet stay here, in order,
for whichever worker frees a row first.

Ids go out longest first across a window of open shards, as the Ray driver hands them to slots
(convtts.run.window: the window's rows are every worker's). Ids handed back (a worker's death, or
asked back for an idle one) go first. At the very end an idle worker takes over ids a
busy one holds and has not begun (the slot asks for them back), so the workers finish within about
one utterance (one batch, batched) of each other.

With workers.deal_first_batch, the workers' first batches are dealt instead: each takes every
k-th of the longest ids, so every worker begins with its share of the job's longest rows and none
holds all of them (their rows would end last, in one process, their flow passes and prefills in
turn with their decode).

Only the slot opens a shard (the resume bookkeeping, before any worker of this run is on it) and
writes its stats file, once every id of every piece of it has been reported or handed back.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from convtts.run.window import MIN_PIECE, OpenShard, Window, longest_first, piece_size, row_words
from convtts.state.layout import Layout, WorkListing
from convtts.state.shardio import (
    append_line,
    crash_counts,
    drop_torn_tail,
    load_done,
    read_json,
    read_jsonl,
    read_rows_checked,
    write_atomic,
)

log = logging.getLogger(__name__)

# A piece is at most a minute or two of one CosyVoice worker, so progress, the stats of a shard
# and the hand-back after a crash come in steadily even when the run is large.
MAX_PIECE = 64


def cut_size(available: int, remaining: int, workers: int, rows: int = 1, room: int = 0) -> int:
    """How many of a shard's `available` ids the next piece takes, `remaining` ids being left in all.

    A batched worker decodes `rows` utterances at once and asks for its next piece before its
    rows run dry, so a piece need not fill them: it may hold up to four times that early on, and
    the last pieces hold MIN_PIECE ids whatever the rows. `room`: the most the asking worker takes
    (a batched one asks for its free rows and a few more; 0: no bound).
    """
    size = piece_size(remaining, workers, min(max(MAX_PIECE, 4 * rows), room or math.inf))
    return available if available - size < MIN_PIECE else size  # no runt left behind in the shard


def batched_room(rows: int, held: int) -> int:
    """How many ids a worker decoding `rows` at once asks for while it holds `held` (begun, queued or
    waiting for the gate): enough for its rows and the engine's look-ahead of a quarter of them,
    and at least an eighth of its rows; 0 (no bound) for a worker of one row."""
    if rows <= 1:
        return 0
    return max(rows // 8, rows + rows // 4 - held, 1)


def preview_room(rows: int, pieces_cut: int, workers: int, hold: bool = False) -> int:
    """The room a preview counts for the next piece: a batched worker's first piece fills it, the
    next ones are what its busy rows ask for. With `hold` (workers.hold_first_batch) its first ask
    is its rows alone, and once that batch has ended it holds nothing and asks to fill them again."""
    if hold and rows > 1 and pieces_cut < 2 * workers:
        return rows if pieces_cut < workers else batched_room(rows, 0)
    return batched_room(rows, 0 if pieces_cut < workers else rows + rows // 4)


def preview_cuts(counts: list[int], workers: int, rows: int = 1, hold: bool = False) -> list[int]:
    """The piece sizes a run with these pending counts per shard is cut into, if no worker dies."""
    sizes, remaining = [], sum(counts)
    for available in counts:
        while available:
            room = preview_room(rows, len(sizes), workers, hold)
            size = cut_size(available, remaining, workers, rows, room)
            sizes.append(size)
            available -= size
            remaining -= size
    return sizes


@dataclass
class Piece:
    shard: str
    ids: list[str]
    crashes: dict[str, int]  # deaths of a worker on an id during this run: each counts as an attempt
    started: set = field(default_factory=set)  # ids the worker said it began (a batch begins several)
    reported: set = field(default_factory=set)  # ids the worker said it spoke or gave up on
    returned: set = field(default_factory=set)  # ids handed back unspoken (asked for, or its worker died)
    errors: dict = field(default_factory=dict)  # errors of the attempts spent on ids tried before, by id

    def unreported(self) -> list[str]:
        return [uid for uid in self.ids if uid not in self.reported and uid not in self.returned]

    def in_flight(self) -> list[str]:
        return [uid for uid in self.unreported() if uid in self.started]

    def unstarted(self) -> list[str]:
        return [uid for uid in self.unreported() if uid not in self.started]

    def complete(self) -> bool:
        return not self.unreported()


@dataclass
class ShardWork(OpenShard):
    """A shard a slot opened for its workers: what its pieces have reported, and what its workers' deaths
    and hand-backs left of each id."""

    crashes: Counter = field(default_factory=Counter)
    errors: dict = field(default_factory=dict)  # ids a worker tried and handed back: the error of each attempt
    out: int = 0  # pieces handed out and not yet finished

    def finished(self) -> bool:
        return not self.pending and not self.out


class WorkQueue:
    """The pending shards of one slot, opened as workers need work, and the pieces handed out."""

    def __init__(
        self, layout: Layout, shards: list[str], run_id: str, workers: int, listing: WorkListing | None = None
    ):
        self.layout, self.run_id, self.workers = layout, run_id, workers
        self.listing = listing  # work/ as the slot started, kept current with its own workers' files
        self.writers = [f"w{wid}" for wid in range(workers)]  # those workers' names (worker.Worker.writer)
        self.taken: list[str] = []  # shards handed to this slot beyond its own (none: see feed.FedWork)
        self.rows = 1  # utterances a worker decodes at once (the backend's batch size)
        self.waiting = deque(shards)
        planned = planned_segments(layout)
        self.estimates = {s: estimate_pending(layout, s, listing, planned.get(s)) for s in shards}
        self.total = sum(self.estimates.values())  # utterances to speak in this run, exact once all are open
        # the estimates of the shards still waiting, summed: remaining() is asked several times a piece,
        # and a long run's slot holds thousands of waiting shards and a window of a few open ones
        self.waiting_ids = self.total
        self.mean_words = mean_words(layout)
        self.todo_words = self.total * self.mean_words  # words of those utterances: exact once all are open
        self.done_words = 0.0  # words of the utterances reported so far
        self.window = Window(layout, run_id, self.mean_words)
        self.deal = False  # workers.deal_first_batch: the first batches dealt from the longest ids
        self.dealt = 0  # first batches cut so far

    def remaining(self) -> int:
        return sum(len(w.pending) for w in self.window.open.values()) + self.waiting_ids

    def has_work(self) -> bool:
        return bool(self.waiting) or any(w.pending for w in self.window.open.values())

    def pending_counts(self) -> list[int]:
        return [len(w.pending) for w in self.window.open.values()] + [self.estimates[s] for s in self.waiting]

    def next_piece(self, room: int = 0) -> Piece | None:
        """The next piece, of at most `room` ids (and a runt) when the worker asking gives a bound."""
        self.open_window()
        work = self.window.first_in_line()
        if work is None:
            return None
        size = cut_size(len(work.pending), self.remaining(), self.workers, self.rows, room)
        ids = self.deal_ids(work, size) if self.dealing(work) else self.window.take(work, size)
        work.out += 1
        work.pieces += 1
        return new_piece(work, ids)

    def open_window(self) -> None:
        """Open waiting shards until the window is full for every worker's rows (convtts.run.window)."""
        while self.waiting and self.window.wants_shard(self.remaining(), self.workers * self.rows):
            self.open_until_pending()

    def dealing(self, work: ShardWork) -> bool:
        """Whether the next piece is a batched worker's first batch, dealt (workers.deal_first_batch)."""
        return self.deal and self.rows > 1 and self.dealt < self.workers and work.front == 0

    def deal_ids(self, work: ShardWork, size: int) -> list[str]:
        """`size` of the shard's ids, every k-th from its longest (k the workers still without a first
        batch), so the first batches share the longest rows out among the workers, as cards are dealt,
        instead of the first worker to ask taking them all (its rows would end last). A shard of fewer
        ids than that deals them at a smaller stride."""
        stride = max(1, min(self.workers - self.dealt, len(work.pending) // max(size, 1)))
        self.dealt += 1
        pending = list(work.pending)
        picked = set(range(0, min(len(pending), stride * size), stride))
        work.pending = deque(uid for i, uid in enumerate(pending) if i not in picked)
        ids = [pending[i] for i in sorted(picked)]
        if len(work.pending) < MIN_PIECE:  # no runt left behind
            ids += [work.pending.popleft() for _ in range(len(work.pending))]
        return ids

    def open_until_pending(self) -> ShardWork | None:
        """Open waiting shards until one has ids to speak; those with none get their stats at once."""
        while self.waiting:
            shard = self.waiting.popleft()
            estimate = self.estimates.pop(shard, 0)
            self.waiting_ids -= estimate
            work = open_shard(self.layout, shard, self.run_id, self.manifests_of(shard))
            self.total += len(work.pending) - estimate
            self.todo_words += sum(work.words.values()) - estimate * self.mean_words
            self.window.open[shard] = work
            if work.pending:
                return work
            self.close(work)
        return None

    def reported(self, piece: Piece, uid: str, ok: bool, audio_seconds: float) -> None:
        work = self.window.open[piece.shard]
        piece.reported.add(uid)
        work.errors.pop(uid, None)
        work.new += ok
        work.failed += not ok
        work.audio_seconds += audio_seconds
        self.done_words += self.window.words_of(work, uid)
        if piece.complete():
            self.finish(piece)

    def returned(self, piece: Piece, ids: list[str], errors: dict | None = None) -> None:
        """Ids a worker handed back unbegun: first in line again (an idle worker is waiting for them), with
        the errors of the attempts spent on those it had tried."""
        ids = [uid for uid in piece.unstarted() if uid in set(ids)]
        piece.returned.update(ids)
        keep_errors(self.window.open[piece.shard], ids, errors)
        self.window.put_back(piece.shard, ids)
        if piece.complete():
            self.finish(piece)

    def worker_died(self, piece: Piece, exitcode: int | None, pid: int, tag: str = "") -> list[str]:
        """Record the death against each id in flight and hand the piece's unreported ids back.

        Every id of a batch in flight is charged one attempt: which one killed the worker is not
        known, and an id charged once is spoken alone from then on (batching.speak_batched), so the
        culprit alone goes on dying until its attempts run out. Returns the ids charged.
        `tag`: what follows the pid in the worker's temporary names (shardio.temporary_path).
        """
        charged = piece.in_flight()
        for uid in charged:
            append_line(
                self.layout.crashes(piece.shard),
                {"id": uid, "run": self.run_id, "exitcode": exitcode, "time": time.time()},
            )
            self.window.open[piece.shard].crashes[uid] += 1
        remove_temporaries_of(self.layout, piece.shard, pid, tag)
        back = piece.unreported()
        piece.returned.update(back)
        self.window.put_back(piece.shard, back)
        self.finish(piece)
        return charged

    def finish(self, piece: Piece) -> None:
        """A piece is in: the shard's stats, when it was its last piece out and nothing is pending."""
        work = self.window.open[piece.shard]
        work.out -= 1
        if work.finished():
            self.close(work)

    def manifests_of(self, shard: str) -> list[Path]:
        """The shard's manifest files: those listed as the slot started and those its workers wrote since."""
        if self.listing is None:
            return self.layout.manifests(shard)
        self.listing.notice(shard, [self.layout.manifest(shard, writer) for writer in self.writers])
        return self.listing.manifests(shard)

    def close(self, work: ShardWork) -> None:
        self.window.close(work, self.manifests_of(work.name))


def new_piece(work, ids: list[str]) -> Piece:
    """A piece of `work`'s ids (a ShardWork, or a fed slot's FedShard), with what earlier attempts left of each."""
    crashes = {uid: work.crashes[uid] for uid in ids if work.crashes[uid]}
    return Piece(work.name, ids, crashes, errors={uid: work.errors[uid] for uid in ids if uid in work.errors})


def keep_errors(work, ids: list[str], errors: dict | None) -> None:
    """The errors a worker handed back with `ids`: the next worker's attempts count on from them."""
    for uid in ids:
        if errors and uid in errors:
            work.errors[uid] = tuple(errors[uid])


def remove_temporaries_of(layout: Layout, shard: str, pid: int, tag: str = "") -> None:
    """A dead worker's half-written audio in a shard: its own names only, not pid 12 against 123."""
    for tmp in layout.audio_dir(shard).glob(f".*.tmp{pid}*"):
        if re.fullmatch(rf"\..+\.tmp{pid}{re.escape(tag)}(\..*)?", tmp.name):
            tmp.unlink(missing_ok=True)


def mean_words(layout: Layout) -> float:
    """Words per planned segment, for shards not opened yet (plan.json's totals)."""
    plan = read_json(layout.plan_file) or {}
    segments = plan.get("segments") or 0
    return (plan.get("words") or 0) / segments if segments else 0.0


def open_shard(layout: Layout, shard: str, run_id: str, manifests: list[Path] | None = None) -> ShardWork:
    """The resume point of a shard: drop its stats, clean up after killed writers, list what is left.
    `manifests`: the shard's manifest files, else listed here."""
    layout.stats(shard).unlink(missing_ok=True)
    audio_dir = layout.audio_dir(shard)
    audio_dir.mkdir(parents=True, exist_ok=True)
    for tmp in audio_dir.glob(".*.tmp*"):
        tmp.unlink(missing_ok=True)  # left by a worker killed mid-write
    done = open_manifests(layout, shard, manifests)
    rows = read_jsonl(layout.shard_file(shard))
    spoken = [row["id"] for row in rows if row["id"] in done]
    todo = [row for row in rows if row["id"] not in done]
    words = row_words(todo)
    return ShardWork(
        shard,
        len(rows),
        deque(longest_first(todo, words)),
        already=len(spoken),
        audio_seconds=sum(done[uid]["duration"] for uid in spoken),
        crashes=crash_counts(layout, shard, run_id),
        words=words,
    )


def open_manifests(layout: Layout, shard: str, paths: list[Path] | None = None) -> dict[str, dict]:
    """Ids already spoken, by row. Each file loses its torn tail (a kill), lines that are not rows,
    rows whose audio is missing or not whole, and rows a later row of the same id replaced, so the
    files hold what a rerun may trust. What was damaged is logged, naming the file.
    `paths`: the shard's manifest files, else listed here."""
    paths = layout.manifests(shard) if paths is None else paths
    for path in paths:
        drop_torn_tail(path)
    problems: list[str] = []
    done = load_done(layout, shard, problems, paths=paths)
    for problem in problems:
        log.warning("%s: %s", shard, problem)
    for path in paths:
        rows, bad = read_rows_checked(path)
        kept = [r for r in rows if done.get(r["id"]) == r]
        if bad or len(kept) != len(rows):
            write_atomic(path, b"".join(_line(r) for r in kept))
    return done


def planned_segments(layout: Layout) -> dict[str, int]:
    """Each shard's segments, as plan.json gives them (a plan made before it did: none)."""
    plan = read_json(layout.plan_file) or {}
    names, sizes = plan.get("shards"), plan.get("shard_segments")
    if not isinstance(names, list) or not isinstance(sizes, list) or len(names) != len(sizes):
        return {}
    return dict(zip(names, sizes))


def estimate_pending(layout: Layout, shard: str, listing: WorkListing | None = None, planned: int | None = None) -> int:
    """Ids of a shard not yet in a manifest, by counting lines (opening the shard gives the exact figure).
    `planned`: the shard's segments from plan.json, so that only a shard begun before is read."""
    spoken = sum(_count_lines(path) for path in (listing or layout).manifests(shard))
    if planned is None:
        planned = _count_lines(layout.shard_file(shard))
    return max(planned - spoken, 0)


def _count_lines(path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def _line(row: dict) -> bytes:
    import orjson

    return orjson.dumps(row) + b"\n"
