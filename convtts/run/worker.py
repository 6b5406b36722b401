"""One synthesis worker process: takes pieces of shards from its slot, speaks them utterance by utterance."""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import time
from dataclasses import dataclass

from convtts.cli import setup_logging
from convtts.config import Config
from convtts.gate.quality import open_gate
from convtts.run.batching import can_batch, speak_batched
from convtts.run.memory import gpu_mb, rss_mb
from convtts.run.messages import Built, DiskFull, Failed, PieceDone, Ready, SpeakPiece, Spoken, Started, Stop
from convtts.run.utterance import Context, Settings, synthesize_with_retries
from convtts.state.layout import Layout
from convtts.state.shardio import append_line, disk_full_text, drop_torn_tail, is_disk_full, read_jsonl

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


def worker_main(args: WorkerArgs, conn) -> None:
    """Spawn entry point. Messages in: SpeakPiece or Stop; out: see convtts.run.messages."""
    _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the slot, which stops us
    setup_logging(args.log_file)
    worker = Worker(args, conn)
    try:
        worker.serve()
    finally:
        worker.release()


class Worker:
    """Serves its slot's pieces; the utterance paths see it through utterance.Host."""

    def __init__(self, args: WorkerArgs, conn):
        self.args = args
        self.conn = conn
        self.config = args.config
        self.layout = Layout(args.out_dir)
        self.settings = Settings.of(self.config, args.run_id)
        self.gate = open_gate(self.config.validate)  # None when validate is off; lives across model rebuilds
        self.context: Context | None = None  # made anew at each model build
        self.since_build = 0
        self.label = f"slot{args.rank}-w{args.wid}"
        self.writer = f"{args.writer_prefix}w{args.wid}"  # names this worker's own manifest and failures files
        self.trimmed: set[str] = set()  # shards whose own files this process has cut back to whole lines
        self.shard_rows: tuple[str, dict] = ("", {})  # the last shard's segments by id

    def send(self, message) -> None:
        self.conn.send(message)

    def serve(self) -> None:
        self.build("start")
        self.send(Ready(self.args.wid))
        while True:
            message = self.conn.recv()
            if isinstance(message, Stop):
                return
            try:
                self.run_piece(message)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                self.stop_for_full_disk(message.shard, exc)
                return

    def stop_for_full_disk(self, shard: str, exc: OSError) -> None:
        """A full disk is no utterance's fault: record no failure, tell the slot, and stop.

        The failed write cleaned up after itself (write_atomic, append_line), so what is on disk
        is as it was before it.
        """
        log.error("%s: %s; stopping, nothing recorded as failed", shard, disk_full_text(exc))
        self.send(DiskFull(shard, disk_full_text(exc)))

    # -- the model -------------------------------------------------------------------------
    @property
    def backend(self):
        return self.context.backend if self.context is not None else None

    def build(self, reason: str) -> None:
        from convtts.speak import build_backend

        started = time.time()
        self.release()
        self.context = Context(build_backend(self.config), self.gate, self.layout, self.settings)
        self.since_build = 0
        seconds = time.time() - started
        log.info("model built (%s) in %.2fs, rss %.0f MiB, gpu %.0f MiB", reason, seconds, rss_mb(), self.gpu_mb())
        self.send(Built(reason, round(seconds, 3), round(rss_mb(), 1), round(self.gpu_mb(), 1)))

    def release(self) -> None:
        if self.context is not None:
            release_backend(self.context.backend)
            self.context = None

    def gpu_mb(self) -> float:
        return gpu_mb(self.backend, self.config.workers.gpu_memory)

    def rebuild_reason(self) -> str | None:
        w = self.config.workers
        if w.rebuild_every and self.since_build >= w.rebuild_every:
            return f"every {w.rebuild_every} utterances"
        if w.max_rss_mb and rss_mb() > w.max_rss_mb:
            return f"rss {rss_mb():.0f} MiB over {w.max_rss_mb}"
        if w.max_gpu_mb and self.gpu_mb() > w.max_gpu_mb:
            return f"gpu {self.gpu_mb():.0f} MiB over {w.max_gpu_mb}"
        return None

    # -- a piece of a shard ----------------------------------------------------------------
    def run_piece(self, piece: SpeakPiece) -> None:
        """Speak the ids the slot handed out, in plan order; the slot writes the shard's stats.

        `piece.crashes` counts deaths of a worker on an id during this run: each was an attempt.
        """
        shard = piece.shard
        self.own_files(shard)
        by_id = self.segments(shard)
        pending = [by_id[uid] for uid in piece.ids]
        if can_batch(self.backend):
            speak_batched(self, shard, pending, piece.crashes)
        else:
            for segment in pending:
                self.speak(shard, segment, piece.crashes.get(segment["id"], 0))
        self.send(PieceDone(shard, len(pending)))

    def segments(self, shard: str) -> dict[str, dict]:
        if self.shard_rows[0] != shard:
            self.shard_rows = (shard, {row["id"]: row for row in read_jsonl(self.layout.shard_file(shard))})
        return self.shard_rows[1]

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
        self.send(Started(uid))

    def speak(self, shard: str, segment: dict, crashes: int) -> None:
        uid = segment["id"]
        self.started(uid)
        row, error = synthesize_with_retries(self, shard, segment, crashes)
        self.record(shard, uid, row, error)
        reason = self.rebuild_reason()
        if reason:
            self.build(reason)

    def record(self, shard: str, uid: str, row: dict | None, error: dict | None) -> None:
        """Append an utterance's manifest row (or failure row) to this worker's files; tell the slot."""
        if row is not None:
            # where and when it was made, and the worker's memory then: memory over time, from the outputs
            row.update(worker=self.label, pid=os.getpid(), finished=round(time.time(), 3), rss_mb=round(rss_mb(), 1),
                       gpu_mb=round(self.gpu_mb(), 1), since_build=self.since_build)
            append_line(self.layout.manifest(shard, self.writer), row)
            self.send(Spoken(uid, row["duration"]))
        else:
            append_line(self.layout.failures(shard, self.writer), error)
            self.send(Failed(uid, error["reason"]))
        self.since_build += 1


def release_backend(backend) -> None:
    """Close a backend and hand its memory back before the next model loads.

    glibc keeps freed heap pages: with a full-size CosyVoice model on CPU, RSS between models
    stayed at 3227 MiB without malloc_trim and fell to about 1050 MiB with it, and the peak over
    five rebuilds settled at 3787 MiB against 3470 (bench/rebuild_memory.py).
    """
    backend.close()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this worker if its slot dies, so no orphan keeps writing a shard."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the slot died before the request above took effect
        os._exit(1)
