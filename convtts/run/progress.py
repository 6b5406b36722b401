"""Progress: a bar per slot on a terminal, a plain periodic line under cron, a status file for run_all."""
from __future__ import annotations

import argparse
import logging
import sys
import time

from convtts.config import WorkerConfig
from convtts.state.layout import Layout
from convtts.state.shardio import disk_full_text, is_disk_full, read_json, write_json_atomic

log = logging.getLogger(__name__)

STATUS_EVERY = 2.0  # seconds between status-file writes


class SlotProgress:
    """Counts one slot's utterances; writes work/slots/slot-N.json for the run_all monitor."""

    def __init__(self, layout: Layout, rank: int, total: int, workers: WorkerConfig):
        self.layout, self.rank, self.total = layout, rank, total
        self.interval = workers.progress_interval
        self.done = self.failed = self.rebuilds = 0
        self.audio_seconds = 0.0
        self.started = self.last_status = self.last_line = time.time()
        self.alive = 0
        self.bar = _bar(total, f"slot {rank}") if sys.stderr.isatty() else None
        layout.slots_dir.mkdir(parents=True, exist_ok=True)
        self.write_status(finished=False)

    def utterance(self, ok: bool, seconds: float) -> None:
        self.done += ok
        self.failed += not ok
        self.audio_seconds += seconds
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(self.rate_text(), refresh=False)

    def retotal(self, total: int) -> None:
        """The slot's total was a line-count estimate until each shard was opened."""
        if total != self.total:
            self.total = total
            if self.bar is not None:
                self.bar.total = total

    def rebuild(self, reason: str, seconds: float, rss_mb: float, gpu_mb: float) -> None:
        if reason != "start":
            self.rebuilds += 1
        log.info("slot %d: model built (%s) in %.2fs; worker rss %.0f MiB, gpu %.0f MiB", self.rank, reason, seconds, rss_mb, gpu_mb)

    def rate_text(self) -> str:
        elapsed = max(time.time() - self.started, 1e-6)
        return f"{self.audio_seconds / elapsed:.2f} audio s/s, {self.failed} failed"

    def tick(self, alive: int) -> None:
        self.alive = alive
        now = time.time()
        if now - self.last_status >= STATUS_EVERY:
            self.write_status(finished=False)
        if self.bar is None and now - self.last_line >= self.interval:
            self.last_line = now
            log.info("slot %d: %s", self.rank, self.line())

    def line(self) -> str:
        handled = self.done + self.failed
        elapsed = time.time() - self.started
        eta = (self.total - handled) * elapsed / handled if handled else float("nan")
        return (f"{handled}/{self.total} utterances ({self.failed} failed), {self.audio_seconds / 3600:.3f} h audio, "
                f"{self.rate_text()}, {self.alive} workers, eta {eta / 60:.1f} min")

    def write_status(self, finished: bool) -> None:
        self.last_status = time.time()
        try:
            write_json_atomic(self.layout.slot_status(self.rank), {
                "rank": self.rank, "total": self.total, "done": self.done, "failed": self.failed,
                "audio_seconds": round(self.audio_seconds, 3), "rebuilds": self.rebuilds, "workers": self.alive,
                "started": self.started, "updated": self.last_status, "finished": finished,
            })
        except OSError as exc:  # only the bars read it: a full disk must not stop the slot from stopping cleanly
            if not is_disk_full(exc):
                raise
            log.warning("slot %d: status file not updated: %s", self.rank, disk_full_text(exc))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        log.info("slot %d: %s", self.rank, self.line())
        self.write_status(finished=True)


def _bar(total: int, label: str, position: int = 0, started: float | None = None):
    import shutil

    from tqdm import tqdm

    # A terminal that reports no size (a detached pty) would get empty or hidden bars: assume 100x20.
    size = shutil.get_terminal_size((100, 20))
    bar = tqdm(total=total, desc=label, unit="utt", position=position, ncols=size.columns, nrows=size.lines, leave=True)
    if started is not None:
        bar.start_t = started  # rate and ETA from the slot's own start, not from when the bar appeared
    return bar


def monitor(out_dir: str, slots: int, started: float) -> None:
    """Bars for every slot of a run, fed from their status files (run_all starts this on a terminal)."""
    layout = Layout(out_dir)
    bars: dict[int, object] = {}
    finished: set[int] = set()
    while True:
        for rank in set(range(slots)) - finished:
            status = read_json(layout.slot_status(rank))
            if not status or status.get("started", 0) < started:
                continue  # nothing yet from this run
            bar = bars.get(rank) or bars.setdefault(rank, _bar(status["total"], f"slot {rank}", rank, status["started"]))
            end = status["updated"] if status.get("finished") else time.time()
            bar.n = status["done"] + status["failed"]
            bar.set_postfix_str(f"{status['audio_seconds'] / max(end - status['started'], 1e-6):.2f} audio s/s, "
                                f"{status['failed']} failed")
            if status.get("finished"):
                finished.add(rank)  # its figures are final: stop its clock
        time.sleep(1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="show per-slot progress bars of a running run_all.sh")
    parser.add_argument("out_dir")
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--since", type=float, default=0.0)
    opts = parser.parse_args()
    try:
        monitor(opts.out_dir, opts.slots, opts.since)
    except KeyboardInterrupt:
        pass
