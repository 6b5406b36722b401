"""Where a slot's start-up time goes, from the command to every worker busy: kept for its log and status file.

Times are seconds since the command started (run_all.sh passes its start as CONVTTS_RUN_STARTED,
the ends of its own steps as CONVTTS_VALIDATED and CONVTTS_MPS_READY, and preprocess's start and end
in plan.exit); a slot started by hand counts from its own start. Events: validated, mps, slot,
plan_started, plan_made, plan (read by the slot), first_busy, all_busy, first_audio. A worker's phases are durations:
process (spawn to its first line),
gate, imports, cuda, modules, frontend, weights, engine, other (the rest of its first build).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

NODE_EVENTS = {"validated": "CONVTTS_VALIDATED", "mps": "CONVTTS_MPS_READY"}


def _env_time(name: str) -> float | None:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return None


class Timeline:
    """The slot's start-up events and each worker's phases."""

    def __init__(self, rank: int, now: float | None = None):
        self.rank = rank
        now = time.time() if now is None else now
        self.origin = _env_time("CONVTTS_RUN_STARTED") or now
        self.events: dict[str, float] = {}
        for event, variable in NODE_EVENTS.items():
            if (at := _env_time(variable)) is not None:
                self.events[event] = round(at - self.origin, 3)
        self.events["slot"] = round(now - self.origin, 3)
        self.workers: dict[int, dict] = {}
        self.busy_logged = False

    def since(self, at: float | None = None) -> float:
        return round((time.time() if at is None else at) - self.origin, 3)

    def mark(self, event: str) -> None:
        """The first time `event` happens (plan, first_audio ...)."""
        self.events.setdefault(event, self.since())

    def plan_made(self, marker: str | None) -> None:
        """The plan is read: when preprocess started and ended (if run_all.sh said), and now."""
        times = plan_times(marker) if marker else None
        if times is not None:
            self.events["plan_started"], self.events["plan_made"] = self.since(times[0]), self.since(times[1])
        self.mark("plan")

    def spawned(self, wid: int) -> None:
        self.workers.setdefault(wid, {})["spawned"] = self.since()

    def ready(self, wid: int, phases: dict) -> None:
        worker = self.workers.setdefault(wid, {})
        if "ready" in worker:
            return  # a worker started again after a death keeps its first figures
        worker.update(ready=self.since(), phases=dict(phases))
        log.info("slot %d: worker %d ready at %.1f s (%s)", self.rank, wid, worker["ready"], phase_text(phases))

    def loaded(self, wid: int, weights: str) -> None:
        """The digest of the weights a worker's first model holds (every worker's must be the same)."""
        if weights:
            self.workers.setdefault(wid, {}).setdefault("weights", weights)

    def began(self, wid: int) -> None:
        """A worker began an utterance; once every started worker has, all are busy."""
        worker = self.workers.setdefault(wid, {})
        if "busy" not in worker:
            worker["busy"] = self.since()
            self.mark("first_busy")
        if not self.busy_logged and all("busy" in w for w in self.workers.values()):
            self.busy_logged = True
            self.events["all_busy"] = max(w["busy"] for w in self.workers.values())
            log.info("slot %d: start-up: %s", self.rank, self.summary())

    def forget(self, wid: int) -> None:
        """A worker retired before it began anything (more workers than utterances)."""
        self.workers.pop(wid, None)

    def summary(self) -> str:
        """E.g. 'all 7 workers busy at 14.0 s (validated 2.1, mps 3.2, slot 3.4, plan 5.0, first ready 12.1)'."""
        ready = [w["ready"] for w in self.workers.values() if "ready" in w]
        marks = ", ".join(f"{name} {at:.1f}" for name, at in self.events.items() if name != "all_busy")
        first = f", first ready {min(ready):.1f}" if ready else ""
        busy = self.events.get("all_busy", float("nan"))
        everyone = "the one worker" if len(self.workers) == 1 else f"all {len(self.workers)} workers"
        return f"{everyone} busy at {busy:.1f} s ({marks}{first})"

    def as_dict(self) -> dict:
        return {
            "origin": self.origin,
            "events": dict(self.events),
            "workers": {str(wid): dict(w) for wid, w in sorted(self.workers.items())},
        }


def phase_text(phases: dict) -> str:
    """E.g. 'imports 4.1, cuda 1.2, modules 2.0, weights 1.4, frontend 0.3'."""
    return ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()) or "no phases"


def plan_exit_code(marker: str) -> int | None:
    """The exit code the plan's maker ended with, which run_all.sh writes to `marker`; None while it runs."""
    fields = _plan_fields(marker)
    return int(fields[0]) if fields and fields[0].lstrip("-").isdigit() else None


def plan_times(marker: str) -> tuple[float, float] | None:
    """When preprocess started and ended, from `marker` ('CODE START END', written by run_all.sh)."""
    fields = _plan_fields(marker)
    try:
        return float(fields[1]), float(fields[2])
    except (IndexError, ValueError):
        return None


def _plan_fields(marker: str) -> list[str]:
    try:
        return Path(marker).read_text().split()
    except FileNotFoundError:
        return []
