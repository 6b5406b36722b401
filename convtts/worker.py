"""One synthesis worker process: takes shards from its slot, speaks them utterance by utterance."""
from __future__ import annotations

import ctypes
import gc
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from convtts.cli import setup_logging
from convtts.config import Config
from convtts.layout import Layout
from convtts.shardio import (
    append_line, crash_counts, drop_torn_tail, load_done, read_jsonl, write_json_atomic,
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


@dataclass
class ShardTally:
    done: int = 0
    failed: int = 0
    skipped_done: int = 0  # already in the manifest when the shard was opened
    audio_seconds: float = 0.0
    started: float = field(default_factory=time.time)


def utterance_seed(base: int, uid: str) -> int:
    """A seed from the id alone, so an utterance sounds the same whichever worker speaks it."""
    digest = hashlib.blake2b(f"{base}:{uid}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def worker_main(args: WorkerArgs, conn) -> None:
    """Spawn entry point. Messages in: ("shard", name) or ("stop",). Out: see Worker.send."""
    _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the slot, which stops us
    setup_logging(args.log_file)
    worker = Worker(args, conn)
    try:
        worker.serve()
    finally:
        worker.release()


class Worker:
    def __init__(self, args: WorkerArgs, conn):
        self.args = args
        self.conn = conn
        self.config = args.config
        self.layout = Layout(args.out_dir)
        self.backend = None
        self.since_build = 0

    def send(self, *message) -> None:
        self.conn.send(message)

    def serve(self) -> None:
        self.build("start")
        self.send("ready", self.args.wid)
        while True:
            message = self.conn.recv()
            if message[0] == "stop":
                return
            self.run_shard(message[1])

    # -- the model -------------------------------------------------------------------------
    def build(self, reason: str) -> None:
        from convtts.backends import build_backend

        started = time.time()
        self.release()
        self.backend = build_backend(self.config)
        self.since_build = 0
        seconds = time.time() - started
        log.info("model built (%s) in %.2fs, rss %.0f MiB, gpu %.0f MiB", reason, seconds, rss_mb(), self.gpu_mb())
        self.send("built", reason, round(seconds, 3), round(rss_mb(), 1), round(self.gpu_mb(), 1))

    def release(self) -> None:
        if self.backend is not None:
            release_backend(self.backend)
            self.backend = None

    def gpu_mb(self) -> float:
        probe = getattr(self.backend, "gpu_memory_mb", None)
        return probe(self.config.workers.gpu_memory) if probe else 0.0

    def rebuild_reason(self) -> str | None:
        w = self.config.workers
        if w.rebuild_every and self.since_build >= w.rebuild_every:
            return f"every {w.rebuild_every} utterances"
        if w.max_rss_mb and rss_mb() > w.max_rss_mb:
            return f"rss {rss_mb():.0f} MiB over {w.max_rss_mb}"
        if w.max_gpu_mb and self.gpu_mb() > w.max_gpu_mb:
            return f"gpu {self.gpu_mb():.0f} MiB over {w.max_gpu_mb}"
        return None

    # -- a shard ---------------------------------------------------------------------------
    def run_shard(self, shard: str) -> None:
        layout = self.layout
        layout.stats(shard).unlink(missing_ok=True)
        audio_dir = layout.audio_dir(shard)
        audio_dir.mkdir(parents=True, exist_ok=True)
        for tmp in audio_dir.glob(".*.tmp*"):
            tmp.unlink(missing_ok=True)  # left by a worker killed mid-write
        done = self.open_manifest(shard)
        crashes = crash_counts(layout, shard, self.args.run_id)
        tally = ShardTally(skipped_done=len(done))
        segments = read_jsonl(layout.shard_file(shard))
        for segment in segments:
            if segment["id"] in done:
                tally.audio_seconds += done[segment["id"]]["duration"]
                continue
            self.speak(shard, segment, crashes.get(segment["id"], 0), tally)
        stats = {
            "shard": shard, "segments": len(segments), "done": tally.done + tally.skipped_done,
            "failed": tally.failed, "pending": 0, "new": tally.done, "audio_seconds": round(tally.audio_seconds, 3),
            "seconds": round(time.time() - tally.started, 3), "run": self.args.run_id,
        }
        write_json_atomic(layout.stats(shard), stats)  # last: the shard's done marker
        self.send("shard_done", shard, stats)

    def open_manifest(self, shard: str) -> dict[str, dict]:
        """Resume point: ids already spoken. Rows whose audio vanished are dropped from the file."""
        path = self.layout.manifest(shard)
        drop_torn_tail(path)
        done = load_done(self.layout, shard)
        rows = read_jsonl(path)
        if len(rows) != len(done):
            tmp = path.with_name(path.name + ".rewrite")
            tmp.write_bytes(b"".join(_line(r) for r in done.values()))
            os.replace(tmp, path)
        return done

    def speak(self, shard: str, segment: dict, crashes: int, tally: ShardTally) -> None:
        from convtts.utterance import synthesize_with_retries

        uid = segment["id"]
        self.send("start", uid)
        row, error = synthesize_with_retries(self, shard, segment, crashes)
        if row is not None:
            append_line(self.layout.manifest(shard), row)
            tally.done += 1
            tally.audio_seconds += row["duration"]
            self.send("done", uid, row["duration"])
        else:
            append_line(self.layout.failures(shard), error)
            tally.failed += 1
            self.send("failed", uid, error["reason"])
        self.since_build += 1
        reason = self.rebuild_reason()
        if reason:
            self.build(reason)


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


def _line(row: dict) -> bytes:
    import orjson

    return orjson.dumps(row) + b"\n"


def rss_mb() -> float:
    """Resident memory of this process in MiB, from /proc (no extra package)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill this worker if its slot dies, so no orphan keeps writing a shard."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the slot died before the request above took effect
        os._exit(1)
