#!/usr/bin/env python3
"""What the quality gate costs and what it measures: the same input spoken with validate off and on.

The input is exactly N segments (200 by default) of the repository's sample text
(tests/data/llava_style.json), whole turns in file order. Each setting runs run_all.sh into a fresh
output directory; the report gives wall times, the gate's own seconds per utterance (the manifest's
quality.gate_seconds), and the ASR round-trip WER figures of summary.json.

    python bench/quality_gate.py --segments 200 --gpus cpu:2 --out bench/results/quality-gate.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from figures import report
from sample_text import DEFAULT_TEXT, read_conversations  # bench/ is this script's own folder on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from convtts.config import load_config
from convtts.plan.conversation import plan_conversation


def make_input(segments: int, path: Path) -> int:
    """Whole turns of the sample conversations, in order, adding up to `segments` segments at the default config."""
    config = load_config(None)
    records, total = [], 0
    for number, record in enumerate(read_conversations(DEFAULT_TEXT)):
        kept = []
        for turn in record["conversations"]:
            count = len(plan_conversation("x", {"conversations": [turn]}, config)[0])
            if total + count <= segments:
                kept.append(turn)
                total += count
        if kept:
            records.append({**record, "id": f"{record.get('id', number)}", "conversations": kept})
        if total == segments:
            break
    path.write_bytes(orjson.dumps(records))
    return total


def run(source: Path, out: Path, gpus: str, gate: bool) -> dict:
    env = dict(os.environ, PYTHON=os.environ.get("PYTHON", sys.executable))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [
        "bash",
        str(REPO / "run_all.sh"),
        "--input",
        str(source),
        "--output-dir",
        str(out),
        "--gpus",
        gpus,
        "--log-dir",
        str(out.parent / f"log-{out.name}"),
        "--set",
        f"validate.enabled={str(gate).lower()}",
    ]
    started = time.time()
    result = subprocess.run(command, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.time() - started
    if result.returncode not in (0, 1):
        raise SystemExit(f"run_all.sh exited {result.returncode}: {result.stderr[-2000:]}")
    summary = orjson.loads((out / "summary.json").read_bytes())
    rows = [orjson.loads(line) for line in (out / "manifest.jsonl").read_bytes().splitlines()]
    gate_seconds = [r["quality"]["gate_seconds"] for r in rows if "gate_seconds" in (r.get("quality") or {})]
    audio = sum(r["duration"] for r in rows)
    return {
        "validate": gate,
        "exit": result.returncode,
        "wall_seconds": round(wall, 2),
        "done": summary["done"],
        "failed": summary["failed"],
        "audio_seconds": round(audio, 2),
        "synthesis_seconds_per_utterance": round(float(np.mean([r["synthesis_seconds"] for r in rows])), 4),
        "gate_seconds_per_utterance": round(float(np.mean(gate_seconds)), 4) if gate_seconds else None,
        "gate_seconds_per_audio_second": round(sum(gate_seconds) / audio, 4) if gate_seconds else None,
        "quality": summary.get("quality"),
        "closing": result.stdout.strip().splitlines()[-4:],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--segments", type=int, default=200)
    p.add_argument("--gpus", default="cpu:2")
    p.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        source = Path(tmp) / "input.json"
        count = make_input(args.segments, source)
        results = {
            "segments": count,
            "gpus": args.gpus,
            "cores": os.cpu_count(),
            "runs": [run(source, Path(tmp) / f"out-{gate}", args.gpus, gate) for gate in (False, True)],
        }
    off, on = results["runs"]
    results["gate_adds_seconds"] = round(on["wall_seconds"] - off["wall_seconds"], 2)
    report(results, args.out)


if __name__ == "__main__":
    main()
