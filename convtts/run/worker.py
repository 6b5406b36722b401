"""One synthesis worker process: keeps a queue of ids fed by its slot's pieces, speaks them utterance by utterance or
in batches."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass

from convtts.cli import setup_logging
from convtts.config import Config
from convtts.counts import plural
from convtts.gate.quality import open_gate
from convtts.run.batching import Regrowth, can_batch, grow_rows, speak_batched
from convtts.run.memory import cap_gpu_memory, rss_mb
from convtts.run.messages import (
    Built,
    DiskFull,
    Failed,
    HandBack,
    Nothing,
    Ready,
    Requeued,
    Returned,
    SpeakPiece,
    Spoken,
    Started,
    Stop,
    Want,
)
from convtts.run.pieces import batched_room
from convtts.run.startup import phase_text
from convtts.run.utterance import Attempt, Context, Settings, synthesize_with_retries
from convtts.run.worker_setup import die_with_parent, release_backend, set_cuda_sync
from convtts.state.layout import Layout
from convtts.state.shardio import (
    append_line,
    disk_full_text,
    drop_torn_tail,
    is_disk_full,
    read_jsonl,
    set_temporary_tag,
)

log = logging.getLogger(__name__)


@dataclass
class WorkerArgs:
    wid: int
    rank: int
    out_dir: str
    config: Config
    run_id: str
    parent_pid: int
    log_file: str | None = None
    writer_prefix: str = ""
    spawned: float = 0.0  # when the slot started this process (time.time())
    temporary_tag: str = ""  # after the pid in this process's temporary file names (fed slots: the host)
    start_method: str = "spawn"  # how the slot started it: spawn, or forked by the forkserver


def worker_main(args: WorkerArgs, conn) -> None:
    """Spawn entry point. Messages in and out: see convtts.run.messages."""
    entered = time.time()
    die_with_parent(args.parent_pid, args.start_method)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the slot, which stops us
    setup_logging(args.log_file)
    log.info("output %s, run %s", os.path.abspath(args.out_dir), args.run_id)  # the log's first line names them
    set_cuda_sync(args.config.workers.cuda_sync)  # before the gate or the model touch the GPU
    set_temporary_tag(args.temporary_tag)
    worker = Worker(args, conn)
    worker.startup["process"] = round(entered - args.spawned, 3) if args.spawned else 0.0
    try:
        worker.serve()
    finally:
        if worker.stopping:  # told to stop, with nothing in hand: the process's exit frees the model at once
            log.info("%s: stopping", worker.label)
        else:
            worker.release()


class Worker:
    """Serves its slot's pieces; the utterance paths see it through utterance.Host."""

    def __init__(self, args: WorkerArgs, conn):
        started = time.time()
        self.args = args
        self.conn = conn
        self.config = args.config
        self.layout = Layout(args.out_dir)
        self.settings = Settings.of(self.config, args.run_id)
        self.gate = open_gate(self.config.validate)  # None when validate is off; lives across model rebuilds
        self.startup: dict = {"gate": round(time.time() - started, 3)} if self.gate else {}
        self.context: Context | None = None  # made anew at each model build
        self.since_build = 0
        self.label = f"slot{args.rank}-w{args.wid}"
        self.writer = f"{args.writer_prefix}w{args.wid}"  # names this worker's own manifest and failures files
        self.trimmed: set[str] = set()  # shards whose own files this process has cut back to whole lines
        self.shard_rows: dict[str, dict] = {}  # segments by id, of the shards of the pieces in hand
        self.queue: deque[Attempt] = deque()  # ids handed to this worker not begun yet (batched: and retries)
        self.alone: deque[Attempt] = deque()  # ids a worker died on in this run: spoken one at a time
        self.in_flight: set[str] = set()  # ids begun and not yet recorded
        self.wanting = False  # asked the slot for more, no answer yet
        self.starved = False  # the slot had nothing: ask again only once idle
        self.asking = True  # False while a piece is spoken by hand (run_piece): ask the slot for nothing
        self.stopping = False
        self.holding = False  # a batched worker's first batch to come or under way: no refill (hold_first_batch)
        self.hold_release = self.config.workers.hold_release  # the share of it back before it takes more
        self.received = 0  # ids the slot has handed this worker
        self.regrowth = Regrowth()  # rows an out-of-memory cut, and when they grow again (batching.GROW_AFTER)

    def send(self, message) -> None:
        self.conn.send(message)

    def serve(self) -> None:
        self.build("start")
        self.holding = self.config.workers.hold_first_batch and self.rows() > 1
        self.send(Ready(self.args.wid, self.startup, self.room()))
        self.wanting = True  # Ready asks for the first piece
        while not self.stopping:
            self.refill()
            if self.stopping:
                return
            try:
                self.speak_some()
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                self.stop_for_full_disk(exc)
                return

    def run_piece(self, piece: SpeakPiece) -> None:
        """Speak one piece to its end and ask the slot for nothing more (a worker driven by hand)."""
        self.add_piece(piece)
        self.asking = False
        try:
            while self.queue or self.alone:
                self.speak_some()
        finally:
            self.asking = True

    def speak_some(self) -> None:
        """The queue's utterances: batched until it runs dry, or the next one alone."""
        grow_rows(self)  # rows cut to one speak one at a time, until they grow again
        if can_batch(self.backend):
            speak_batched(self)
            return
        self.speak((self.alone or self.queue).popleft())

    def stop_for_full_disk(self, exc: OSError) -> None:
        """A full disk is no utterance's fault: record no failure, tell the slot, and stop.

        The failed write cleaned up after itself (write_atomic, append_line), so what is on disk
        is as it was before it.
        """
        log.error("%s; stopping, nothing recorded as failed", disk_full_text(exc))
        self.send(DiskFull(disk_full_text(exc)))

    # -- the slot's messages ---------------------------------------------------------------
    def rows(self) -> int:
        return self.backend.batch_rows if can_batch(self.backend) else 1

    def low_water(self) -> int:
        """Ask for more while this many ids are still queued: a batched worker's rows never wait."""
        rows = self.rows()
        return max(1, rows // 16) if rows > 1 else 0

    def room(self) -> int:
        """How many ids to ask for (0: no bound). A batched worker holds its rows and a few more: the
        rest wait in the slot, longest first, for whichever worker frees a row next, so no worker
        sits on long ids it cannot begin while another runs dry at the end of a run."""
        room = batched_room(self.rows(), self.in_hand())
        return min(room, max(1, self.rows() - self.received)) if self.holding else room

    def in_hand(self) -> int:
        """Ids handed to this worker and not yet recorded: begun, queued, or to be spoken alone."""
        return len(self.in_flight) + len(self.queue) + len(self.alone)

    def held(self) -> bool:
        """Whether to ask for nothing now: once the slot has filled the first batch's rows, they decode
        to their end undisturbed (workers.hold_first_batch). The hold ends with that batch
        (batching.run_batch), or once the worker has had ids and has none in hand (ids a worker died
        on, say, are spoken alone, outside any batch)."""
        if self.holding and self.received and not self.in_hand():
            self.holding = False
        return self.holding and self.received >= self.rows()

    def refill(self) -> None:
        """Read what the slot said; ask for more when the queue runs low; with nothing left, wait for an answer.

        The slot answers a busy worker at once (a piece, or Nothing); an idle one it may keep
        waiting while it asks another worker to hand ids back, or until it says Stop.
        """
        while self.conn.poll():
            self.take(self.conn.recv())
        if not self.asking or self.held():
            return
        idle = not self.in_hand()
        if not self.wanting and len(self.queue) <= self.low_water() and (idle or not self.starved):
            self.send(Want(self.room()))
            self.wanting = True
        while self.wanting and not self.queue and not self.alone and not self.stopping:
            self.take(self.conn.recv())

    def take(self, message) -> None:
        if isinstance(message, SpeakPiece):
            self.add_piece(message)
        elif isinstance(message, Nothing):
            self.wanting, self.starved = False, True
        elif isinstance(message, HandBack):
            self.hand_back(message.count)
        elif isinstance(message, Stop):
            self.wanting, self.stopping = False, True

    def add_piece(self, piece: SpeakPiece) -> None:
        """Queue a piece's ids in plan order; those a worker died on are spoken alone."""
        self.own_files(piece.shard)
        by_id = self.segments(piece.shard)
        self.received += len(piece.ids)
        for uid in piece.ids:
            crashes = piece.crashes.get(uid, 0)
            item = Attempt.after_crashes(by_id[uid], crashes, piece.shard, piece.errors.get(uid, ()))
            (self.alone if crashes else self.queue).append(item)
        self.wanting = self.starved = False

    def hand_back(self, count: int) -> None:
        """Give the slot up to `count` queued ids not begun yet, from the end of the queue; those waiting
        for another attempt go with the errors of the attempts they spent. A take the quality gate refused
        stays: its scores and the seed of its next take are this worker's."""
        back = [item for item in reversed(self.queue) if not item.started][:count]
        for item in back:
            self.queue.remove(item)
        errors = {item.segment["id"]: tuple(item.errors) for item in back if item.errors}
        self.send(Returned(tuple(item.segment["id"] for item in reversed(back)), errors))

    def segments(self, shard: str) -> dict[str, dict]:
        if shard not in self.shard_rows:
            # pieces come from the slot's open shards: its window, or all of them near the end (pieces.py)
            if len(self.shard_rows) >= 64:
                self.shard_rows.pop(next(iter(self.shard_rows)))
            self.shard_rows[shard] = {row["id"]: row for row in read_jsonl(self.layout.shard_file(shard))}
        return self.shard_rows[shard]

    # -- the model -------------------------------------------------------------------------
    @property
    def backend(self):
        return self.context.backend if self.context is not None else None

    def build(self, reason: str) -> None:
        from convtts.speak import build_backend

        started = time.time()
        self.release()
        if reason == "start":
            self.cap_gpu_memory()
        self.context = Context(build_backend(self.config), self.gate, self.layout, self.settings)
        self.since_build = 0
        self.regrowth = Regrowth()  # a new backend has all its rows
        seconds = time.time() - started
        phases = dict(self.backend.load_phases)
        phases["other"] = round(max(0.0, seconds - sum(phases.values())), 3)
        digest = self.backend.weights_digest()
        log.info(
            "model built (%s) in %.2fs (%s), rss %.0f MiB, gpu %.0f MiB%s",
            reason,
            seconds,
            phase_text(phases),
            rss_mb(),
            self.gpu_mb(),
            f", weights {digest}" if digest else "",
        )
        if reason == "start":
            self.startup.update(phases)
        self.send(Built(reason, round(seconds, 3), round(rss_mb(), 1), round(self.gpu_mb(), 1), phases, digest))

    def cap_gpu_memory(self) -> None:
        cap = self.config.workers.gpu_mb_cap
        share = cap_gpu_memory(cap)
        if share is not None:
            log.info(
                "workers.gpu_mb_cap: this worker's allocations held to %d MiB (%.1f%% of its GPU)", cap, 100 * share
            )
        elif cap:
            log.warning("workers.gpu_mb_cap=%d: no GPU here, nothing to cap", cap)

    def release(self) -> None:
        if self.context is not None:
            release_backend(self.context.backend)
            self.context = None

    def gpu_mb(self) -> float:
        return self.backend.gpu_memory_mb(self.config.workers.gpu_memory)

    def rebuild_reason(self) -> str | None:
        w = self.config.workers
        if w.rebuild_every and self.since_build >= w.rebuild_every:
            return f"every {plural(w.rebuild_every, 'utterance')}"
        if w.max_rss_mb and rss_mb() > w.max_rss_mb:
            return f"rss {rss_mb():.0f} MiB over {w.max_rss_mb}"
        if w.max_gpu_mb and self.gpu_mb() > w.max_gpu_mb:
            return f"gpu {self.gpu_mb():.0f} MiB over {w.max_gpu_mb}"
        return None

    # -- utterances ------------------------------------------------------------------------
    def own_files(self, shard: str) -> None:
        """Cut a torn last line off this worker's files of the shard before its first append.

        A worker of the same number killed mid-line left it; that one is dead (the slot joined it,
        or a previous run ended), so this process is the files' only writer.
        """
        if shard not in self.trimmed:
            drop_torn_tail(self.layout.manifest(shard, self.writer))
            drop_torn_tail(self.layout.failures(shard, self.writer))
            self.trimmed.add(shard)

    def started(self, uid: str) -> None:
        self.in_flight.add(uid)  # a retry in a later batch begins the same id again
        self.send(Started(uid))

    def requeued(self, item: Attempt) -> None:
        """A begun id back in the queue for another attempt: not begun again until it leaves it, so the slot
        may ask for it back; but one with a refused take stays here (see hand_back)."""
        uid = item.segment["id"]
        self.in_flight.discard(uid)  # counted in the queue now
        if not item.refused:
            item.started = 0.0
            self.send(Requeued(uid))

    def speak(self, item: Attempt) -> None:
        uid = item.segment["id"]
        self.started(uid)
        row, error = synthesize_with_retries(self, item)
        self.record(item.shard, uid, row, error)
        reason = self.rebuild_reason()
        if reason:
            self.build(reason)

    def record(self, shard: str, uid: str, row: dict | None, error: dict | None) -> None:
        """Append an utterance's manifest row (or failure row) to this worker's files; tell the slot."""
        if row is not None:
            # where and when it was made, and the worker's memory then: memory over time, from the outputs
            row.update(
                worker=self.label,
                pid=os.getpid(),
                finished=round(time.time(), 3),
                rss_mb=round(rss_mb(), 1),
                gpu_mb=round(self.gpu_mb(), 1),
                since_build=self.since_build,
            )
            append_line(self.layout.manifest(shard, self.writer), row)
            self.send(Spoken(uid, row["duration"]))
        else:
            append_line(self.layout.failures(shard, self.writer), error)
            self.send(Failed(uid, error["reason"]))
        self.in_flight.discard(uid)
        self.since_build += 1
        self.regrowth.finished += 1
