"""Progress: a bar per slot on a terminal, a plain periodic line under cron, a status file for run_all."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from convtts.config import Config
from convtts.counts import plural
from convtts.run.startup import Timeline
from convtts.state.layout import Layout
from convtts.state.shardio import disk_full_text, is_disk_full, read_json, write_json_atomic

log = logging.getLogger(__name__)

STATUS_EVERY = 2.0  # seconds between status-file writes


def plan_seconds_per_word(layout: Layout) -> float | None:
    """Seconds of audio a planned word (or CJK character) is estimated at, from plan.json."""
    plan = read_json(layout.plan_file) or {}
    words, seconds = plan.get("words"), plan.get("estimated_seconds")
    return seconds / words if words and seconds else None  # plans made before estimated_seconds: None


class SlotProgress:
    """Counts one slot's utterances and audio; writes work/slots/slot-N.json for the run_all monitor and benchmarks.

    The estimate of what is left is in audio, not utterances: the plan knows each segment's words
    (characters in Chinese, Japanese, Korean), and its estimated hours over its words give the
    seconds of one, at each language's rate (text.words_per_minute, text.chars_per_minute), so a run
    of long answers after short questions does not fool it. Nothing is written before the plan is
    read (`begin`).
    """

    def __init__(self, layout: Layout, rank: int, config: Config, timeline: Timeline):
        self.layout, self.rank, self.timeline = layout, rank, timeline
        self.interval = config.workers.progress_interval
        self.seconds_per_word = 60.0 / config.text.words_per_minute
        self.work = None  # the slot's WorkQueue, once the plan is read
        self.done = self.failed = self.rebuilds = 0
        self.audio_seconds = 0.0
        self.started = self.last_status = self.last_line = time.time()
        self.alive = self.loading = 0
        self.bar = None

    @property
    def total(self) -> int:
        return self.work.total if self.work is not None else 0

    def begin(self, work) -> None:
        self.work = work
        self.seconds_per_word = plan_seconds_per_word(self.layout) or self.seconds_per_word
        self.layout.slots_dir.mkdir(parents=True, exist_ok=True)
        self.bar = _bar(self.total, f"slot {self.rank}") if sys.stderr.isatty() else None
        self.write_status(finished=False)

    def utterance(self, ok: bool, seconds: float) -> None:
        self.done += ok
        self.failed += not ok
        self.audio_seconds += seconds
        self.timeline.mark("first_audio")
        if self.bar is not None:
            self.bar.total = self.total  # exact once every shard is opened
            self.bar.update(1)
            self.bar.set_postfix_str(self.rate_text(), refresh=False)

    def rebuild(self, reason: str, seconds: float, rss_mb: float, gpu_mb: float) -> None:
        if reason != "start":
            self.rebuilds += 1
        log.info(
            "slot %d: model built (%s) in %.2fs; worker rss %.0f MiB, gpu %.0f MiB",
            self.rank,
            reason,
            seconds,
            rss_mb,
            gpu_mb,
        )

    def busy_seconds(self) -> float:
        """Seconds since the first worker began an utterance (start-up does not count against the rate)."""
        first = self.timeline.events.get("first_busy")
        return time.time() - self.timeline.origin - first if first is not None else 0.0

    def rate_text(self) -> str:
        return f"{self.audio_seconds / max(self.busy_seconds(), 1e-6):.2f} audio s/s, {self.failed} failed"

    def estimate(self) -> tuple[float, float, float | None]:
        """(planned audio seconds of this run, the share of them done, seconds left or None if unknown)."""
        if self.work is None or not self.work.todo_words:
            return 0.0, 0.0, None
        share = min(1.0, self.work.done_words / self.work.todo_words)
        busy = self.busy_seconds()
        eta = busy * (1 - share) / share if share > 0 and busy > 0 else None
        return self.work.todo_words * self.seconds_per_word, share, eta

    def tick(self, alive: int, loading: int) -> None:
        self.alive, self.loading = alive, loading
        now = time.time()
        if self.work is None:
            return
        if now - self.last_status >= STATUS_EVERY:
            self.write_status(finished=False)
        if self.bar is None and now - self.last_line >= self.interval:
            self.last_line = now
            log.info("slot %d: %s", self.rank, self.line())

    def line(self) -> str:
        handled = self.done + self.failed
        planned, share, eta = self.estimate()
        their = "its" if self.loading == 1 else "their"
        loading = f" ({self.loading} still loading {their} model)" if self.loading else ""
        left = f"eta {eta / 60:.1f} min" if eta is not None else "eta not known yet"
        return (
            f"{handled}/{plural(self.total, 'utterance')} ({self.failed} failed), "
            f"{self.audio_seconds / 3600:.3f} h audio, {self.rate_text()}, {plural(self.alive, 'worker')}{loading}, "
            f"{share:.0%} of {planned / 3600:.2f} h planned, {left}"
        )

    def write_status(self, finished: bool) -> None:
        self.last_status = time.time()
        planned, share, eta = self.estimate()
        try:
            write_json_atomic(
                self.layout.slot_status(self.rank),
                {
                    "rank": self.rank,
                    "total": self.total,
                    "done": self.done,
                    "failed": self.failed,
                    "audio_seconds": round(self.audio_seconds, 3),
                    "rebuilds": self.rebuilds,
                    "workers": self.alive,
                    "loading": self.loading,
                    "planned_audio_seconds": round(planned, 1),
                    "planned_share_done": round(share, 4),
                    "eta_seconds": None if eta is None else round(eta, 1),
                    "started": self.started,
                    "updated": self.last_status,
                    "finished": finished,
                    "startup": self.timeline.as_dict(),
                },
            )
        except OSError as exc:  # only the bars read it: a full disk must not stop the slot from stopping cleanly
            if not is_disk_full(exc):
                raise
            log.warning("slot %d: status file not updated: %s", self.rank, disk_full_text(exc))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.work is not None:
            log.info("slot %d: %s", self.rank, self.line())
            self.write_status(finished=True)


def _bar(total: int, label: str, position: int = 0, started: float | None = None):
    import shutil

    from tqdm import tqdm

    # A terminal that reports no size (a detached pty) would get empty or hidden bars: assume 100x20.
    size = shutil.get_terminal_size((100, 20))
    # No tqdm estimate of the time left: it counts utterances; ours (in the postfix) counts planned audio.
    bar = tqdm(
        total=total,
        desc=label,
        unit="utt",
        position=position,
        ncols=size.columns,
        nrows=size.lines,
        leave=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
    )
    if started is not None:
        bar.start_t = started  # rate and ETA from the slot's own start, not from when the bar appeared
    return bar


def status_text(status: dict) -> str:
    """A slot's rate, failures and what is left, from its status file: '4.00 audio s/s, 0 failed, eta 2.5 min'."""
    end = status["updated"] if status.get("finished") else time.time()
    text = f"{status['audio_seconds'] / max(end - status['started'], 1e-6):.2f} audio s/s, {status['failed']} failed"
    if status.get("loading"):
        text += f", {plural(status['loading'], 'worker')} loading"
    if not status.get("finished") and status.get("eta_seconds") is not None:
        text += f", eta {status['eta_seconds'] / 60:.1f} min"
    return text


def monitor(out_dir: str, slots: int, started: float, parent: int = 0) -> None:
    """Bars for every slot of a run, fed from their status files (run_all starts this on a terminal),
    until `parent` (the run) is gone: a run killed with SIGKILL cannot stop it."""
    layout = Layout(out_dir)
    bars: dict[int, object] = {}
    finished: set[int] = set()
    while not parent or os.getppid() == parent:
        for rank in set(range(slots)) - finished:
            status = read_json(layout.slot_status(rank))
            if not status or status.get("started", 0) < started:
                continue  # nothing yet from this run
            bar = bars.get(rank) or bars.setdefault(
                rank, _bar(status["total"], f"slot {rank}", rank, status["started"])
            )
            bar.total, bar.n = status["total"], status["done"] + status["failed"]
            bar.set_postfix_str(status_text(status))
            if status.get("finished"):
                finished.add(rank)  # its figures are final: stop its clock
        time.sleep(1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="show per-slot progress bars of a running run_all.sh")
    parser.add_argument("out_dir")
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--since", type=float, default=0.0)
    parser.add_argument("--parent-pid", type=int, default=0, help="stop once this process (run_all.sh) is gone")
    opts = parser.parse_args()
    # run_all.sh starts it in the background, where bash has Ctrl-C ignored; it stops with the run.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        monitor(opts.out_dir, opts.slots, opts.since, opts.parent_pid)
    except KeyboardInterrupt:
        pass
