#!/usr/bin/env python3
"""The pipeline's own cost per utterance: run_all.sh with the silence backend (no model) on generated
LLaVA-like conversations, under /usr/bin/time -v, split into plan, slots and merge from the logs.

    python bench/silence_pipeline.py --conversations 400 --gpus cpu:2 --out bench/results/x.json
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import orjson

from figures import report
from preprocess_bench import generate  # bench/ is on sys.path
from sample_text import DEFAULT_TEXT

REPO = Path(__file__).resolve().parents[1]
STAMP = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.M)


def log_span(path: Path) -> tuple[float, float]:
    """Epoch seconds of a log's first and last time-stamped lines."""
    stamps = STAMP.findall(path.read_bytes())
    first, last = (datetime.strptime(s.decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp() for s in (stamps[0], stamps[-1]))
    return first, last


def time_v(report: str, name: str) -> float:
    match = re.search(rf"{re.escape(name)}: ([\d.]+)", report)
    return float(match.group(1)) if match else 0.0


def run(root: Path, conversations: int, gpus: str, workers: int | None, overrides: list[str]) -> dict:
    source, out, logs = root / "conversations.json", root / "out", root / "log"
    generate(source, conversations, False, 0, Path(DEFAULT_TEXT))
    cmd = [
        "/usr/bin/time",
        "-v",
        "bash",
        str(REPO / "run_all.sh"),
        "--input",
        str(source),
        "--output-dir",
        str(out),
        "--gpus",
        gpus,
        "--set",
        "tts.backend=silence",
        "--log-dir",
        str(logs),
    ]
    cmd += ["--workers", str(workers)] if workers else []
    for item in overrides:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    started = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    ended = time.time()
    summary = orjson.loads((out / "summary.json").read_bytes())
    rows = [orjson.loads(line) for line in (out / "manifest.jsonl").read_bytes().splitlines()]
    plan_start, plan_end = log_span(next(logs.rglob("preprocess.log")))
    slot_spans = [log_span(p) for p in logs.rglob("slot-*.log")]
    slots_start, slots_end = min(s for s, _ in slot_spans), max(e for _, e in slot_spans)
    slot_log = next(logs.rglob("slot-0.log")).read_text()
    started_line = re.search(r"slot 0: (.*starting \d+ workers.*)", slot_log)
    n = len(rows)
    return {
        "rc": result.returncode,
        "conversations": conversations,
        "utterances": n,
        "gpus": gpus,
        "audio_hours": summary["audio_hours"],
        "audio_bytes": sum((out / r["audio"]).stat().st_size for r in rows),
        "wall_s": round(ended - started, 2),
        "cpu_s": round(
            time_v(result.stderr, "User time (seconds)") + time_v(result.stderr, "System time (seconds)"), 2
        ),
        "phases_s": {
            "check_and_lock": round(plan_start - started, 2),
            "plan": round(plan_end - plan_start, 2),
            "slots": round(slots_end - slots_start, 2),
            "merge_and_exit": round(ended - slots_end, 2),
        },
        "ms_per_utterance": {
            "run_wall": round((ended - started) / n * 1000, 3),
            "slots_wall": round((slots_end - slots_start) / n * 1000, 3),
            "cpu_all_processes": round(
                (time_v(result.stderr, "User time (seconds)") + time_v(result.stderr, "System time (seconds)"))
                / n
                * 1000,
                3,
            ),
            # inside a worker: synthesis (zeros), the audio check, encoding, the atomic write, the row
            "worker_per_row": round(sum(r["synthesis_seconds"] for r in rows) / n * 1000, 3),
        },
        "slot0_plan": started_line.group(1) if started_line else None,
        "stderr_tail": result.stderr[-1500:] if result.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=400)
    parser.add_argument("--gpus", default="cpu:2")
    parser.add_argument("--workers", type=int, help="workers per slot (default: run_all.sh's choice)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--workdir", default="/tmp")
    parser.add_argument("--out")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="convtts-silence-", dir=args.workdir))
    try:
        result = run(root, args.conversations, args.gpus, args.workers, args.overrides)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result.update(cpu_count=os.cpu_count(), load_average=os.getloadavg())
    report(result, args.out)
    return result["rc"]


if __name__ == "__main__":
    sys.exit(main())
