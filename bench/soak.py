#!/usr/bin/env python3
"""Fault soak: SIGKILL a real run at seeded random moments, N times, then rerun it to the end and check it.

Each kill takes one of three targets, in seeded random order (every block of three kills has each
once): the whole run (run_all.sh's process group), one slot (a parallel_cosyvoice.py process), or
one worker (a process a slot spawned). A killed whole run is restarted at once, after its processes
are gone; after a slot or worker kill the run goes on until the next kill or its own end (exit 1
when a slot died), and the same command is started again whenever it has exited. Then one last run
must exit 0 and leave every planned id exactly once, audio that decodes, no temporary file, no lock
held and no process behind.

    python bench/soak.py --kills 100 --out bench/results/soak-2core-2026-11-23.json
"""

from __future__ import annotations

import argparse
import fcntl
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from convtts.state.shardio import read_json, read_jsonl
from convtts.state.verify import check_complete, temporary_files

DEFAULT_INPUT = REPO / "tests" / "data" / "llava_style.json"
KINDS = ("run", "slot", "worker")
# Planned segments per requested kill. Since workers pull small pieces, 2 cores speak about 2.7
# segments a second through the kills (restarts included): at 6 per kill, 100 kills ran out of work
# after 27. At 30 the kills all land well before the end and the last runs still have work.
SEGMENTS_PER_KILL = 30
STRAY_TIMEOUT = 30.0  # seconds for a killed run's processes to be gone (workers die with their slot)


@dataclass
class SoakOptions:
    kills: int = 8
    seed: int = 0
    input: Path = DEFAULT_INPUT
    repeat: int = 0  # copies of all the input's records; 0: about segments_per_kill * kills segments
    segments_per_kill: int = SEGMENTS_PER_KILL
    window: tuple[float, float] = (2.0, 12.0)  # seconds from one kill (or start) to the next
    slots: int = 2
    workers: int = 2
    segments_per_shard: int = 4
    work_dir: Path | None = None
    final_timeout: float = 1800.0


@dataclass
class Run:
    """One start of the run_all.sh command, in its own process group."""

    index: int
    proc: subprocess.Popen

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def exited(self) -> bool:
        return self.proc.poll() is not None


# --- processes ----------------------------------------------------------------------------------


@dataclass
class Proc:
    pid: int
    ppid: int
    pgid: int
    cmdline: bytes


def processes() -> list[Proc]:
    """Every live process (zombies left out: they are dead, only not yet reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        found.append(Proc(int(entry.name), int(fields[1]), int(fields[2]), cmdline))
    return found


def targets(run: Run, kind: str) -> list[int]:
    """Pids of one kind in a run: the run itself, its slots, or the workers its slots spawned."""
    if run.exited():
        return []
    if kind == "run":
        return [run.pgid]
    mine = [p for p in processes() if p.pgid == run.pgid]
    slots = [p.pid for p in mine if b"parallel_cosyvoice.py" in p.cmdline]
    if kind == "slot":
        return slots
    return [p.pid for p in mine if p.ppid in slots and b"multiprocessing.spawn" in p.cmdline]


def strays(pgids: set[int], out: Path) -> list[Proc]:
    """Processes of any run so far: in one of their process groups, or naming the output directory."""
    me = {os.getpid(), os.getppid()}
    needle = str(out).encode()
    return [p for p in processes() if p.pid not in me and (p.pgid in pgids or needle in p.cmdline)]


def lock_is_free(out: Path) -> bool:
    try:
        fd = os.open(out / ".lock", os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


# --- the input ----------------------------------------------------------------------------------


def load_records(path: Path) -> list[dict]:
    """Conversation records from a JSON array or JSON lines; LLaVA question-answer rows grouped by image."""
    data = path.read_bytes()
    rows = (
        orjson.loads(data)
        if data.lstrip().startswith(b"[")
        else [orjson.loads(x) for x in data.splitlines() if x.strip()]
    )
    if rows and "conversations" not in rows[0] and "instruction" in rows[0]:
        by_image: OrderedDict[str, dict] = OrderedDict()
        for row in rows:  # {"id", "image", "instruction", "output"}: one question and answer about an image
            record = by_image.setdefault(row["id"], {"id": row["id"], "conversations": []})
            record["conversations"] += [
                {"from": "human", "value": row["instruction"]},
                {"from": "gpt", "value": row["output"]},
            ]
        rows = list(by_image.values())
    return rows


def estimated_segments(record: dict) -> int:
    """Rough segment count at the default 30 words a segment (sentence breaks make a few more)."""
    return sum(max(1, math.ceil(len(str(t.get("value", "")).split()) / 25)) for t in record["conversations"])


def write_soak_input(options: SoakOptions, path: Path) -> dict:
    """The soak's input: the input's records in turn until there are about `segments_per_kill` per kill.

    With `repeat`, that many copies of all of them instead. Later rounds get ids of their own ("<id>-copy001").
    """
    records = load_records(Path(options.input))
    target = options.kills * options.segments_per_kill
    chosen, segments = [], 0
    while (len(chosen) < options.repeat * len(records)) if options.repeat else segments < target:
        k, i = divmod(len(chosen), len(records))
        base = str(records[i].get("id") or f"record{i}")
        chosen.append({**records[i], "id": base if k == 0 else f"{base}-copy{k:03d}"})
        segments += estimated_segments(records[i])
    path.write_bytes(orjson.dumps(chosen))
    return {"input": str(options.input), "records_used": len(chosen), "estimated_segments": segments}


# --- the soak -----------------------------------------------------------------------------------


class SoakFailed(Exception):
    """The soak cannot go on: processes that do not die, a run that never ends."""


def kind_order(rng: random.Random, kills: int) -> list[str]:
    """Seeded random kinds; each block of three holds each kind once, so a short soak still has all three."""
    order: list[str] = []
    while len(order) < kills:
        block = list(KINDS)
        rng.shuffle(block)
        order += block
    return order[:kills]


class Soak:
    def __init__(self, options: SoakOptions, work: Path):
        self.o = options
        self.rng = random.Random(options.seed)
        self.work = work
        self.out, self.logs, self.source = work / "out", work / "log", work / "input.json"
        self.runs: list[Run] = []
        self.unsettled: set[int] = set()  # process groups of ended runs not yet seen empty
        self.exit_codes: Counter = Counter()
        self.kills: Counter = Counter()
        self.events: list[dict] = []
        self.problems: list[str] = []
        self.missed = 0
        self.stray_wait_max = 0.0
        self.finished_early = False
        self.t0 = time.monotonic()

    def command(self) -> list[str]:
        o = self.o
        return [
            "bash",
            str(REPO / "run_all.sh"),
            "--input",
            str(self.source),
            "--output-dir",
            str(self.out),
            "--gpus",
            f"cpu:{o.slots}",
            "--workers",
            str(o.workers),
            "--log-dir",
            str(self.logs),
            "--set",
            f"shards.segments_per_shard={o.segments_per_shard}",
        ]

    def start(self) -> Run:
        self.settle()
        env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(REPO))
        with open(self.work / f"run-{len(self.runs):03d}.log", "wb") as log:
            proc = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # its own process group: a whole-run kill takes all of it
        self.runs.append(Run(len(self.runs), proc))
        self.unsettled.add(proc.pid)
        return self.runs[-1]

    def settle(self) -> None:
        """Before a start: every process of the earlier runs gone (a killed slot's workers die with it)."""
        started = time.monotonic()
        while left := strays(self.unsettled, self.out):
            if time.monotonic() - started > STRAY_TIMEOUT:
                raise SoakFailed(
                    f"processes still there {STRAY_TIMEOUT:.0f} s after their run ended: "
                    + "; ".join(f"{p.pid} {p.cmdline[:120]!r}" for p in left[:5])
                )
            time.sleep(0.1)
        self.unsettled.clear()  # checked once: a pid (and so a group id) may be reused later
        self.stray_wait_max = max(self.stray_wait_max, time.monotonic() - started)

    def ended(self, run: Run, killed: bool = False) -> int:
        code = run.proc.wait()
        self.exit_codes[str(code)] += 1
        if code not in ((-signal.SIGKILL,) if killed else (0, 1)):
            self.problems.append(f"run {run.index} exited {code} (see {self.work / f'run-{run.index:03d}.log'})")
        return code

    def keep_running(self, run: Run) -> Run | None:
        """The same command again if the run has exited; None once one exited 0 (nothing left to kill)."""
        if not run.exited():
            return run
        if self.ended(run) == 0:
            self.finished_early = True
            return None
        return self.start()

    def wait(self, run: Run, seconds: float) -> Run | None:
        deadline = time.monotonic() + seconds
        while run is not None and time.monotonic() < deadline:
            time.sleep(0.05)
            run = self.keep_running(run)
        return run

    def find_target(self, run: Run, kind: str) -> tuple[Run | None, int]:
        """Poll until the run has a process of this kind (a run still planning has no slot yet)."""
        draw = self.rng.random()  # drawn once per kill, so the sequence does not depend on polling
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            pids = sorted(targets(run, kind))
            if pids:
                return run, pids[int(draw * len(pids))]
            run = self.keep_running(run)
            if run is None:
                return None, 0
            time.sleep(0.02)
        raise SoakFailed(f"run {run.index} showed no {kind} process for 300 s")

    def kill(self, run: Run, kind: str, pid: int) -> bool:
        try:
            if kind == "run":
                os.killpg(run.pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended between the look and the kill
            self.missed += 1
            return False
        return True

    def kill_loop(self) -> Run | None:
        """The N kills; returns the run still going after the last one, if any."""
        run: Run | None = self.start()
        kinds = kind_order(self.rng, self.o.kills)
        for number, kind in enumerate(kinds, 1):
            delay = self.rng.uniform(*self.o.window)
            run = self.wait(run, delay)
            killed = False
            while run is not None and not killed:
                run, pid = self.find_target(run, kind)
                killed = run is not None and self.kill(run, kind, pid)
            if run is None:
                return None
            self.kills[kind] += 1
            self.events.append(
                {
                    "kill": number,
                    "kind": kind,
                    "pid": pid,
                    "run": run.index,
                    "delay": round(delay, 2),
                    "at": round(time.monotonic() - self.t0, 2),
                }
            )
            if kind == "run":
                self.ended(run, killed=True)
                run = self.start() if number < len(kinds) else None
        return run

    def final_run(self, run: Run | None) -> dict:
        """Let a run still going end by itself, then the same command once more, to the end."""
        if run is not None:
            self.wait_end(run)
            self.ended(run)
        started = time.monotonic()
        last = self.start()
        self.wait_end(last)
        code = self.ended(last)
        if code != 0:
            self.problems.append(f"the final rerun exited {code}, not 0")
        return {"exit_code": code, "wall_seconds": round(time.monotonic() - started, 1)}

    def wait_end(self, run: Run) -> None:
        try:
            run.proc.wait(timeout=self.o.final_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(run.pgid, signal.SIGKILL)
            raise SoakFailed(f"run {run.index} did not end within {self.o.final_timeout:.0f} s") from None

    def check(self) -> dict:
        """The finished output, looked at from outside: what the final rerun must have left."""
        problems = check_complete(self.out)
        problems += [f"temporary file left: {p}" for p in temporary_files(self.out)]
        if not lock_is_free(self.out):
            problems.append(f"{self.out / '.lock'} is still locked after the last run ended")
        try:
            self.settle()
        except SoakFailed as exc:
            problems.append(str(exc))
        rows = read_jsonl(self.out / "manifest.jsonl")
        work_ids = Counter(r.get("id") for p in (self.out / "work").glob("*.manifest.jsonl") for r in read_jsonl(p))
        work_duplicates = sum(n - 1 for n in work_ids.values() if n > 1)  # spoken twice: lost work, not wrong output
        self.problems += problems
        return {
            "utterances": len(rows),
            "audio_seconds": round(sum(r["duration"] for r in rows), 1),
            "duplicates": sum(n - 1 for n in Counter(r["id"] for r in rows).values() if n > 1),
            "work_duplicates": work_duplicates,
            "worker_deaths_recorded": sum(len(read_jsonl(p)) for p in (self.out / "work").glob("*.crashes.jsonl")),
        }


def soak(options: SoakOptions) -> dict:
    """Run the soak and return its figures; `problems` is empty when everything held."""
    work = Path(options.work_dir or tempfile.mkdtemp(prefix="convtts-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    s = Soak(options, work)
    figures: dict = {
        "seed": options.seed,
        "kills_requested": options.kills,
        "window_seconds": list(options.window),
        "slots": options.slots,
        "workers_per_slot": options.workers,
        "segments_per_shard": options.segments_per_shard,
        "cpu_count": os.cpu_count(),
        "work_dir": str(work),
        "code": code_version(),
    }
    figures.update(write_soak_input(options, s.source))
    try:
        figures["final_rerun"] = s.final_run(s.kill_loop())
        figures.update(s.check())
    except SoakFailed as exc:
        s.problems.append(str(exc))
        for run in s.runs:
            if not run.exited():
                os.killpg(run.pgid, signal.SIGKILL)
    figures.update(
        {
            "kills": {**{k: s.kills[k] for k in KINDS}, "total": sum(s.kills.values())},
            "kills_missed": s.missed,
            "finished_before_all_kills": s.finished_early,
            "runs": len(s.runs),
            "restarts": max(0, len(s.runs) - 1),
            "run_exit_codes": dict(sorted(s.exit_codes.items())),
            "orphan_wait_max_seconds": round(s.stray_wait_max, 2),
            "wall_seconds": round(time.monotonic() - s.t0, 1),
            "planned": _planned(s.out),
            "problems": s.problems,
            "events": s.events,
        }
    )
    return figures


def code_version() -> dict:
    """The commit the soak ran on, and the files that differed from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return done.stdout.rstrip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "uncommitted": git("status", "--porcelain").splitlines()}


def _planned(out: Path) -> int:
    plan = read_json(out / "plan" / "plan.json") or {}
    return plan.get("segments", 0)


def summary_lines(f: dict) -> list[str]:
    k = f["kills"]
    lines = [
        f"kills: {k['total']} of {f['kills_requested']} (run {k['run']}, slot {k['slot']}, worker {k['worker']}), "
        f"{f['restarts']} restarts, exits {f['run_exit_codes']}, {f['wall_seconds']:.0f} s in all",
        f"utterances {f.get('utterances', '?')} of {f['planned']} planned, {f.get('audio_seconds', '?')} s audio, "
        f"duplicates {f.get('duplicates', '?')}, worker deaths recorded {f.get('worker_deaths_recorded', '?')}",
        f"final rerun: exit {f.get('final_rerun', {}).get('exit_code', '?')} "
        f"in {f.get('final_rerun', {}).get('wall_seconds', '?')} s; "
        f"longest wait for a killed run's processes {f['orphan_wait_max_seconds']} s",
    ]
    if f["finished_before_all_kills"]:
        lines.append("the work finished before all kills were made: give more input (--repeat)")
    lines.append(f"problems: {len(f['problems'])}" + "".join(f"\n  {p}" for p in f["problems"][:20]))
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--input", "--text", type=Path, default=DEFAULT_INPUT, help="conversations (JSON array or JSON lines)"
    )
    p.add_argument(
        "--repeat", type=int, default=0, help="copies of the whole input (default: as much as --kills needs)"
    )
    p.add_argument("--segments-per-kill", type=int, default=SEGMENTS_PER_KILL, help="input size without --repeat")
    p.add_argument(
        "--window",
        type=float,
        nargs=2,
        default=(2.0, 12.0),
        metavar=("MIN", "MAX"),
        help="seconds between kills, drawn uniformly",
    )
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--segments-per-shard", type=int, default=4)
    p.add_argument("--work-dir", type=Path, help="keep the output and logs here (default: a temporary folder, removed)")
    p.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = p.parse_args()
    options = SoakOptions(
        kills=args.kills,
        seed=args.seed,
        input=args.input,
        repeat=args.repeat,
        segments_per_kill=args.segments_per_kill,
        window=tuple(args.window),
        slots=args.slots,
        workers=args.workers,
        segments_per_shard=args.segments_per_shard,
        work_dir=args.work_dir,
    )
    figures = soak(options)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2) + b"\n")
    print("\n".join(summary_lines(figures)))
    if args.work_dir is None and not figures["problems"]:
        shutil.rmtree(figures["work_dir"], ignore_errors=True)
    return 0 if not figures["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
