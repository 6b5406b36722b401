"""One device slot: hands pieces of shards to K spawned workers as they ask, restarts the ones that die, reports
progress.

At the end of the work an idle worker takes over ids a busy one holds and has not begun (the slot
asks the busy one to hand them back), so the workers finish close together.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from convtts import EXIT_DISK_FULL, EXIT_FAILURES, EXIT_OK
from convtts.config import Config
from convtts.counts import plural
from convtts.run.feed import FedWork
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
from convtts.run.pieces import Piece, WorkQueue, preview_cuts, remove_temporaries_of
from convtts.run.processes import Handle, end, worker_context
from convtts.run.progress import SlotProgress
from convtts.run.startup import Timeline, plan_exit_code
from convtts.run.weights import warm_page_cache
from convtts.run.worker import WorkerArgs, worker_main
from convtts.speak import Resources, backend_resources
from convtts.state.layout import Layout, WorkListing
from convtts.state.shardio import (
    disk_full_text,
    is_disk_full,
    only_gate_refusals,
    shard_complete,
    shard_complete_and_whole,
)

log = logging.getLogger(__name__)

# A worker that dies this many times in a row without finishing an utterance means the model
# cannot run here at all (bad driver, no memory): stop instead of restarting forever.
MAX_BARREN_DEATHS = 3


# Which Slot method handles each message of a worker.
HANDLERS = {
    Ready: "on_ready",
    Want: "on_want",
    Started: "on_started",
    Requeued: "on_requeued",
    Spoken: "on_spoken",
    Failed: "on_failed",
    Built: "on_built",
    Returned: "on_returned",
    DiskFull: "on_disk_full",
}


class SlotStopped(Exception):
    """SIGTERM or SIGINT reached the slot."""


@dataclass
class SlotOptions:
    rank: int
    workers: int
    run_id: str
    log_dir: str | None = None
    writer_prefix: str = ""  # names its workers' files: "" gives w0, w1 ... (see parallel_cosyvoice --feed)
    temporary_tag: str = ""  # after the pid in its workers' temporary names (a fed slot: its host's)
    verify: bool = False  # open every audio file of the shards marked done (--verify), not trust their markers


@dataclass
class Slot:
    layout: Layout
    config: Config
    share: Callable[[], list[str]]  # this slot's shards, read once the plan is made
    options: SlotOptions
    handles: dict[int, Handle] = field(default_factory=dict)
    barren_deaths: int = 0
    spared: set = field(default_factory=set)  # workers a fed slot stopped at the end of the work (spare)
    halted: str | None = None  # why the slot hands out no more work (a full disk, changed weights)
    halt_code: int = EXIT_OK
    feed: object | None = None  # a convtts.run.feed.ShardFeed: pieces of shards handed out by a driver
    timeline: Timeline | None = None
    shards: list[str] = field(default_factory=list)
    work: WorkQueue | FedWork | None = None
    resources: Resources | None = None  # what its voice needs (speak.backend_resources); None: on a CPU

    def __post_init__(self):
        self.resources = self.resources or backend_resources(self.config, "cpu")
        self.timeline = self.timeline or Timeline(self.options.rank)
        self.progress = SlotProgress(self.layout, self.options.rank, self.config, self.timeline)
        self.parent = os.getppid()

    def start_workers(self) -> None:
        """All K workers at once, before the plan is read: each loads its model meanwhile and speaks
        as soon as it is up. The weight files are read into the page cache for their mapped loads."""
        self.ctx = worker_context(self.config, self.resources)
        log.info("slot %d: workers start by %s", self.options.rank, self.ctx.get_start_method())
        warm_page_cache(list(self.resources.weights), self.options.rank)
        for wid in range(self.options.workers):
            self.start_worker(wid)

    def run(self, plan_ready: str | None = None) -> int:
        """Wait for the plan (`plan_ready`: the file preprocess's exit code is written to), then speak."""
        try:
            if getattr(self, "ctx", None) is None:  # parallel_cosyvoice.py starts them before its checks
                self.start_workers()
            if not self.await_plan(plan_ready):
                return EXIT_FAILURES
            code = self.begin()
            if code is not None:
                return code
            self.supervise()
        except OSError as exc:  # the slot's own writes: a crash line
            if not is_disk_full(exc):
                raise
            self.stop_for_full_disk(disk_full_text(exc))
        finally:
            self.stop_workers()
            self.progress.close()
        return self.exit_code()

    def await_plan(self, marker: str | None) -> bool:
        """Until the plan is made (its maker's exit code in `marker`): the workers load meanwhile."""
        while marker is not None and (code := plan_exit_code(marker)) is None:
            if os.getppid() != self.parent:
                log.error("slot %d: the run that started this slot is gone; stopping", self.options.rank)
                return False
            if not self.handles:
                log.error("slot %d: no worker could load its model; stopping", self.options.rank)
                return False
            self.pump(0.2)
        if marker is not None and code != 0:
            log.info("slot %d: the plan was not made (exit %s); stopping", self.options.rank, code)
            return False
        self.timeline.plan_made(marker)
        return True

    def begin(self) -> int | None:
        """Read the plan: this slot's work, and its worker count; an exit code when there is nothing to do."""
        self.shards = self.share()
        # work/ listed once: a glob per shard is quadratic, and nothing writes to these shards yet
        listing = WorkListing(self.layout)
        verify = self.options.verify
        todo = [s for s in self.shards if not shard_complete_and_whole(self.layout, s, listing, verify)]  # logs damage
        if not todo and self.feed is None:
            log.info("slot %d: %s already complete", self.options.rank, plural(len(self.shards), "shard"))
            return EXIT_OK
        if self.feed is not None:
            writer = self.options.writer_prefix.rstrip("-")
            options = self.options
            self.work = FedWork(self.layout, options.run_id, writer, self.feed, options.workers, options.verify)
        else:
            self.work = WorkQueue(self.layout, todo, self.options.run_id, self.options.workers, listing)
            if not self.work.total:
                self.work.open_until_pending()  # every id has a row: the shards may need only their stats
        # Workers are capped by utterances, not shards: pieces keep them all busy even on one shard.
        # A slot fed by a driver gets more shards later: it keeps all of its workers.
        count = self.options.workers if self.feed is not None else min(self.options.workers, self.work.total)
        self.work.workers = max(count, 1)
        self.work.rows = self.resources.rows
        if isinstance(self.work, WorkQueue):
            self.work.deal = self.config.workers.deal_first_batch
        log.info("slot %d: %s", self.options.rank, self.plan_text(todo, count))
        self.retire(count)
        self.progress.begin(self.work)
        return None

    def plan_text(self, todo: list[str], count: int) -> str:
        """E.g. '118 utterances to do in 1 of 1 shard, cut into about 45 pieces of 2-5 utterances; 14 workers'."""
        hold = self.config.workers.hold_first_batch
        sizes = preview_cuts(self.work.pending_counts(), count, self.work.rows, hold) or [0]
        each = plural(min(sizes), "utterance") if min(sizes) == max(sizes) else f"{min(sizes)}-{max(sizes)} utterances"
        workers = plural(count, "worker")
        if count < self.options.workers:
            workers = f"keeping {count} of {plural(self.options.workers, 'worker')}"
        text = (
            f"{plural(self.work.total, 'utterance')} to do in {len(todo)} of {plural(len(self.shards), 'shard')}, "
            f"cut into about {plural(len(sizes), 'piece')} of {each}; {workers}"
        )
        if self.feed is not None:
            text = f"pieces of shards handed out by the driver; {workers}"
        if self.work.rows > 1:
            text += f" of {self.work.rows} rows each"  # the sizing line above says where they came from
        if count < self.options.workers:
            text += ": no more than utterances to do"
        return text

    def retire(self, count: int) -> None:
        """Stop the workers past the first `count` (a job of fewer utterances than workers); they have begun nothing."""
        for wid in [w for w in sorted(self.handles) if w >= count]:
            end([self.handles.pop(wid).proc])
            self.timeline.forget(wid)

    def start_worker(self, wid: int) -> None:
        parent_conn, child_conn = self.ctx.Pipe()
        log_file = f"{self.options.log_dir}/slot-{self.options.rank}-worker-{wid}.log" if self.options.log_dir else None
        args = WorkerArgs(
            wid,
            self.options.rank,
            str(self.layout.root),
            self.config,
            self.options.run_id,
            os.getpid(),
            log_file,
            self.options.writer_prefix,
            time.time(),
            self.options.temporary_tag,
            self.ctx.get_start_method(),
        )
        proc = self.ctx.Process(
            target=worker_main, args=(args, child_conn), name=f"slot{self.options.rank}-w{wid}", daemon=True
        )
        proc.start()
        child_conn.close()
        self.handles[wid] = Handle(wid, proc, parent_conn)
        self.timeline.spawned(wid)

    def supervise(self) -> None:
        while self.handles and not self.halted:
            self.pump(self.pump_timeout())
            self.assign()
            self.progress.tick(
                alive=len(self.handles), loading=sum(not h.ready and not h.stopping for h in self.handles.values())
            )

    def pump_timeout(self) -> float:
        """A second; less while the driver has said to wait, so that idle workers ask it again on time."""
        wait = self.feed.retry_in() if self.feed is not None else 0.0
        return min(1.0, wait) if wait > 0 else 1.0

    def pump(self, timeout: float) -> None:
        """Wait up to `timeout` for any worker to say something or die; handle what happened."""
        ready = wait(
            [h.conn for h in self.handles.values()] + [h.proc.sentinel for h in self.handles.values()], timeout=timeout
        )
        for handle in list(self.handles.values()):
            if handle.conn in ready:
                self.drain(handle)
            if handle.wid in self.handles and not handle.proc.is_alive():
                self.on_death(handle)

    def drain(self, handle: Handle) -> None:
        try:
            while handle.conn.poll():
                self.on_message(handle, handle.conn.recv())
        except (EOFError, OSError):
            pass  # the worker is gone; its sentinel reports the death

    def on_message(self, handle: Handle, message) -> None:
        getattr(self, HANDLERS[type(message)])(handle, message)

    def on_ready(self, handle: Handle, message: Ready) -> None:
        handle.ready = handle.wants = True  # its first piece, as soon as its own model is up
        handle.room = message.room
        self.timeline.ready(handle.wid, message.phases)

    def on_want(self, handle: Handle, message: Want) -> None:
        handle.wants, handle.room = True, message.room

    def on_started(self, handle: Handle, message: Started) -> None:
        piece = handle.piece_of(message.uid)
        if piece is not None:
            piece.started.add(message.uid)
        self.timeline.began(handle.wid)

    def on_requeued(self, handle: Handle, message: Requeued) -> None:
        piece = handle.piece_of(message.uid)
        if piece is not None:
            piece.started.discard(message.uid)  # waiting in its queue: it may be asked for back

    def on_spoken(self, handle: Handle, message: Spoken) -> None:
        self.on_reported(handle, message.uid, True, message.audio_seconds)

    def on_failed(self, handle: Handle, message: Failed) -> None:
        self.on_reported(handle, message.uid, False, 0.0)

    def on_reported(self, handle: Handle, uid: str, ok: bool, seconds: float) -> None:
        piece = handle.piece_of(uid)
        if piece is None:
            log.warning("slot %d: worker %d reported %s, which it does not hold", self.options.rank, handle.wid, uid)
            return
        self.work.reported(piece, uid, ok=ok, audio_seconds=seconds)  # the shard's stats, after its last id
        if piece.complete():
            handle.pieces.remove(piece)
        handle.spoke = True
        self.barren_deaths = 0
        self.progress.utterance(ok=ok, seconds=seconds)

    def on_returned(self, handle: Handle, message: Returned) -> None:
        handle.asked_back = False
        for piece in list(handle.pieces):
            ids = [uid for uid in message.ids if uid in set(piece.ids)]
            if ids:
                self.work.returned(piece, ids, message.errors)
            if piece.complete():
                handle.pieces.remove(piece)
        if message.ids:
            log.info(
                "slot %d: worker %d handed back %s it had not begun",
                self.options.rank,
                handle.wid,
                plural(len(message.ids), "utterance"),
            )

    def on_built(self, handle: Handle, message: Built) -> None:
        self.progress.rebuild(message.reason, message.seconds, message.rss_mb, message.gpu_mb)
        if message.reason == "start":
            self.timeline.loaded(handle.wid, message.weights)
        self.check_weights(handle, message.weights)

    def check_weights(self, handle: Handle, digest: str) -> None:
        """Every worker must hold the same weights: the first load's digest is the slot's; a worker
        that loaded others (the model files changed under the run) is stopped, and the slot with it."""
        if not digest:
            return
        self.weights = getattr(self, "weights", None) or digest
        if digest != self.weights:
            log.error(
                "slot %d: worker %d loaded weights %s, not the %s of the others: the model files changed "
                "during the run; stopping",
                self.options.rank,
                handle.wid,
                digest,
                self.weights,
            )
            self.halt("the model's weights changed under the run", EXIT_FAILURES)

    def on_disk_full(self, handle: Handle, message: DiskFull) -> None:
        handle.pieces, handle.ready, handle.wants, handle.stopping = [], False, False, True  # it stops by itself
        self.stop_for_full_disk(message.what)

    def assign(self) -> None:
        """Answer every worker that asked: pieces; Nothing while it is busy; an idle one waits for
        ids handed back by a busy one, or for the driver, else it is told to stop."""
        for handle in list(self.handles.values()):
            if not handle.ready or not handle.wants:
                continue
            pieces = self.pieces_for(handle.room)
            if pieces:
                for piece in pieces:
                    handle.pieces.append(piece)
                    # dead: on_death returns it
                    handle.tell(SpeakPiece(piece.shard, piece.ids, piece.crashes, piece.errors))
            elif handle.pieces:
                handle.tell(Nothing())  # it asks again once idle
            elif not self.halted and self.take_back_for(handle):
                continue  # it waits: the ids come back in a moment
            elif self.halted or not self.work or not self.work.has_work() or self.spare(handle):
                handle.tell(Stop())
                handle.ready, handle.stopping = False, True
            else:
                continue  # a fed slot idles while the driver says wait
            handle.wants = False
        self.regrow()

    def pieces_for(self, room: int) -> list[Piece]:
        """What a worker that asked for `room` ids gets: pieces until they fill it (one piece for 0,
        no bound). Pieces stop where another open shard's next id is longer, so with many shards
        open one piece may hold a few ids where the worker has a flow pass's worth of rows free."""
        found = []
        while not self.halted and self.work is not None and (piece := self.work.next_piece(room)) is not None:
            found.append(piece)
            room -= len(piece.ids)
            if room <= 0:
                break
        return found

    def spare(self, handle: Handle) -> bool:
        """An idle worker of a fed slot once every id is out: stopped as a slot of its own shards would,
        but for one, which takes what a lost slot may hand back while the others are started again."""
        if self.feed is None or not self.feed.ending:
            return False
        if sum(not h.stopping for h in self.handles.values()) <= 1:
            return False
        self.spared.add(handle.wid)
        return True

    def regrow(self) -> None:
        """The workers stopped as spare, started again once the driver no longer says every id is out
        (a lost slot's are coming back)."""
        if not self.spared or self.halted or self.feed.ending or self.feed.exhausted:
            return
        for wid in sorted(self.spared - set(self.handles)):  # each one's process has ended
            self.spared.discard(wid)
            log.info("slot %d: worker %d started again for work a lost slot held", self.options.rank, wid)
            self.start_worker(wid)

    def take_back_for(self, idle: Handle) -> bool:
        """Ask the busy worker holding the most ids it has not begun for half of them; True while
        one such hand-back is out (the idle worker waits for it)."""
        if any(h.asked_back for h in self.handles.values()):
            return True
        busy = [h for h in self.handles.values() if h is not idle and not h.stopping and h.unstarted()]
        if not busy:
            return False
        victim = max(busy, key=Handle.unstarted)
        # a victim that died meanwhile hands its ids back through on_death instead
        victim.asked_back = victim.tell(HandBack((victim.unstarted() + 1) // 2))
        return True

    def on_death(self, handle: Handle) -> None:
        self.drain(handle)  # what it reported before dying still counts
        handle.proc.join(timeout=5)
        code = handle.proc.exitcode
        del self.handles[handle.wid]
        if handle.stopping and not handle.pieces and code == 0:
            return  # told to stop, and it did
        charged = []
        for piece in handle.pieces:
            charged += self.work.worker_died(piece, code, handle.proc.pid, self.options.temporary_tag)
        shards = sorted({p.shard for p in handle.pieces}) or None
        log.error(
            "slot %d: worker %d died (exit %s) in %s on %s",
            self.options.rank,
            handle.wid,
            code,
            shards,
            charged or None,
        )
        self.barren_deaths = 0 if handle.spoke else self.barren_deaths + 1
        if self.barren_deaths >= MAX_BARREN_DEATHS:
            log.error(
                "slot %d: workers died %s in a row without speaking; giving up",
                self.options.rank,
                plural(self.barren_deaths, "time"),
            )
            return
        if (self.work is None or self.work.has_work()) and not self.halted:
            self.start_worker(handle.wid)

    def stop_for_full_disk(self, what: str) -> None:
        self.halt(what, EXIT_DISK_FULL)

    def halt(self, what: str, code: int) -> None:
        """Hand out no more work; supervise returns and the other workers are stopped."""
        log.error("slot %d: %s; stopping this slot's workers", self.options.rank, what)
        if self.halted is None:
            self.halted, self.halt_code = what, code  # assign hands out no more pieces

    def stop_workers(self) -> None:
        busy = [(h.proc.pid, p.shard) for h in self.handles.values() if h.proc.is_alive() for p in h.pieces]
        end([handle.proc for handle in self.handles.values()])
        for pid, shard in busy:  # a worker stopped mid-write leaves a temporary file: the disk may be full
            remove_temporaries_of(self.layout, shard, pid, self.options.temporary_tag)

    def exit_code(self) -> int:
        if self.halt_code == EXIT_DISK_FULL:
            log.error("slot %d: stopped: %s; free space and run the same command again", self.options.rank, self.halted)
            return EXIT_DISK_FULL
        if self.halted:
            return self.halt_code
        incomplete = [
            s for s in self.shards + (self.work.taken if self.work else []) if not shard_complete(self.layout, s)
        ]
        unfinished = [s for s in incomplete if not only_gate_refusals(self.layout, s)]
        if unfinished:
            has = "shard has" if len(unfinished) == 1 else "shards have"
            log.warning("slot %d: %d %s failed or unfinished utterances", self.options.rank, len(unfinished), has)
            return EXIT_FAILURES
        if incomplete:  # no fault of the slot's: merge counts the refused takes and sets the run's exit code
            log.info(
                "slot %d: %s utterances whose every take the quality gate refused "
                "(validate.on_fail=fail); see failures.jsonl once merged",
                self.options.rank,
                plural(len(incomplete), "shard holds", "shards hold"),
            )
        return EXIT_OK


def install_stop_handlers() -> None:
    def stop(signum, frame):
        # Once: Ctrl-C reaches the slot from the terminal and run_all.sh's TERM follows; a second
        # SlotStopped would break off the stopping of the workers half way.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SlotStopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
