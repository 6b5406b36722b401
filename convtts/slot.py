"""One device slot: hands shards to K spawned workers, restarts the ones that die, reports progress."""
from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from convtts import EXIT_FAILURES, EXIT_OK
from convtts.config import Config
from convtts.layout import Layout
from convtts.progress import SlotProgress
from convtts.shardio import append_line, shard_complete
from convtts.worker import WorkerArgs, worker_main

log = logging.getLogger(__name__)

# A worker that dies this many times in a row without finishing an utterance means the model
# cannot run here at all (bad driver, no memory): stop instead of restarting forever.
MAX_BARREN_DEATHS = 3


class SlotStopped(Exception):
    """SIGTERM or SIGINT reached the slot."""


@dataclass
class Handle:
    wid: int
    proc: object
    conn: object
    ready: bool = False
    shard: str | None = None
    uid: str | None = None
    spoke: bool = False  # finished at least one utterance since it started


@dataclass
class SlotOptions:
    rank: int
    workers: int
    run_id: str
    log_dir: str | None = None


@dataclass
class Slot:
    layout: Layout
    config: Config
    shards: list[str]
    options: SlotOptions
    handles: dict[int, Handle] = field(default_factory=dict)
    queue: deque = field(default_factory=deque)
    barren_deaths: int = 0

    def run(self) -> int:
        self.queue.extend(s for s in self.shards if not shard_complete(self.layout, s))
        if not self.queue:
            log.info("slot %d: all %d shards already complete", self.options.rank, len(self.shards))
            return EXIT_OK
        self.progress = SlotProgress(self.layout, self.options.rank, self.pending_utterances(), self.config.workers)
        count = min(self.options.workers, len(self.queue))
        log.info("slot %d: %d shards to do, %d workers", self.options.rank, len(self.queue), count)
        self.ctx = _spawn_context()
        _install_stop_handlers()
        try:
            for wid in range(count):
                self.start_worker(wid)
            self.supervise()
        finally:
            self.stop_workers()
            self.progress.close()
        return self.exit_code()

    def pending_utterances(self) -> int:
        total = 0
        for shard in self.queue:
            total += _count_lines(self.layout.shard_file(shard)) - _count_lines(self.layout.manifest(shard))
        return max(total, 0)

    def start_worker(self, wid: int) -> None:
        parent_conn, child_conn = self.ctx.Pipe()
        log_file = f"{self.options.log_dir}/slot-{self.options.rank}-worker-{wid}.log" if self.options.log_dir else None
        args = WorkerArgs(wid, self.options.rank, str(self.layout.root), self.config, self.options.run_id, os.getpid(), log_file)
        proc = self.ctx.Process(target=worker_main, args=(args, child_conn), name=f"slot{self.options.rank}-w{wid}", daemon=True)
        proc.start()
        child_conn.close()
        self.handles[wid] = Handle(wid, proc, parent_conn)

    def supervise(self) -> None:
        while self.handles:
            ready = wait([h.conn for h in self.handles.values()] + [h.proc.sentinel for h in self.handles.values()], timeout=1.0)
            for handle in list(self.handles.values()):
                if handle.conn in ready:
                    self.drain(handle)
                if handle.wid in self.handles and not handle.proc.is_alive():
                    self.on_death(handle)
            self.assign()
            self.progress.tick(alive=len(self.handles))

    def drain(self, handle: Handle) -> None:
        try:
            while handle.conn.poll():
                self.on_message(handle, handle.conn.recv())
        except (EOFError, OSError):
            pass  # the worker is gone; its sentinel reports the death

    def on_message(self, handle: Handle, message: tuple) -> None:
        kind = message[0]
        if kind == "ready":
            handle.ready = True
        elif kind == "start":
            handle.uid = message[1]
        elif kind in ("done", "failed"):
            handle.uid, handle.spoke = None, True
            self.barren_deaths = 0
            self.progress.utterance(ok=kind == "done", seconds=message[2] if kind == "done" else 0.0)
        elif kind == "built":
            self.progress.rebuild(*message[1:])
        elif kind == "shard_done":
            log.info("slot %d: %s finished: %s", self.options.rank, message[1], message[2])
            handle.shard = None

    def assign(self) -> None:
        for handle in self.handles.values():
            if handle.ready and handle.shard is None:
                if self.queue:
                    handle.shard = self.queue.popleft()
                    handle.conn.send(("shard", handle.shard))
                else:
                    handle.conn.send(("stop",))
                    handle.ready = False

    def on_death(self, handle: Handle) -> None:
        handle.proc.join(timeout=5)
        code = handle.proc.exitcode
        del self.handles[handle.wid]
        if handle.shard is None and not handle.ready and code == 0:
            return  # told to stop, and it did
        log.error("slot %d: worker %d died (exit %s) in %s on %s", self.options.rank, handle.wid, code, handle.shard, handle.uid)
        if handle.uid is not None:
            append_line(self.layout.crashes(handle.shard), {"id": handle.uid, "run": self.options.run_id, "exitcode": code, "time": time.time()})
        if handle.shard is not None:
            self.queue.appendleft(handle.shard)
        self.barren_deaths = 0 if handle.spoke else self.barren_deaths + 1
        if self.barren_deaths >= MAX_BARREN_DEATHS:
            log.error("slot %d: workers died %d times in a row without speaking; giving up", self.options.rank, self.barren_deaths)
            return
        if self.queue:
            self.start_worker(handle.wid)

    def stop_workers(self) -> None:
        for handle in self.handles.values():
            if handle.proc.is_alive():
                handle.proc.terminate()
        deadline = time.time() + 10
        for handle in self.handles.values():
            handle.proc.join(timeout=max(0.1, deadline - time.time()))
            if handle.proc.is_alive():
                handle.proc.kill()
                handle.proc.join()

    def exit_code(self) -> int:
        incomplete = [s for s in self.shards if not shard_complete(self.layout, s)]
        if incomplete:
            log.warning("slot %d: %d shards have failed or unfinished utterances", self.options.rank, len(incomplete))
            return EXIT_FAILURES
        return EXIT_OK


def _spawn_context():
    import torch.multiprocessing as tmp

    return tmp.get_context("spawn")


def _count_lines(path) -> int:
    try:
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def _install_stop_handlers() -> None:
    def stop(signum, frame):
        raise SlotStopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

