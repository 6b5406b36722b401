#!/usr/bin/env python3
"""Throughput of the whole pipeline on CPU slots (the default Piper voice): audio seconds per wall second.

Runs run_all.sh on the repository's LLaVA-style sample conversations (or --text) into a fresh output directory per
setting and reads
two rates: end to end (summary.json: planning, model loads and the tail included) and steady state
(from the manifest's finish times, first and last 10% of utterances left out).

    python bench/cpu_throughput.py --settings cpu:1x1 cpu:2x1 --images 12 --out bench/results/cpu
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from sample_text import DEFAULT_TEXT, read_conversations  # bench/ is this script's own folder on sys.path
from throughput import steady_state

REPO = Path(__file__).resolve().parents[1]


def write_input(text_file: Path, images: int, path: Path) -> None:
    """The first `images` conversations of the text file, as a JSON array."""
    path.write_bytes(orjson.dumps(read_conversations(text_file)[:images]))


def run_setting(spec: str, source: Path, work: Path) -> dict:
    """spec `cpu:SxW`: S slots of W workers each."""
    slots, workers = spec.removeprefix("cpu:").split("x")
    out = work / spec.replace(":", "-")
    cmd = [
        "bash",
        str(REPO / "run_all.sh"),
        "--input",
        str(source),
        "--output-dir",
        str(out),
        "--gpus",
        f"cpu:{slots}",
        "--workers",
        workers,
        "--log-dir",
        str(work / "log"),
        "--set",
        "shards.segments_per_shard=10",
    ]
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.time() - started
    summary = orjson.loads((out / "summary.json").read_bytes()) if (out / "summary.json").exists() else {}
    rows = (
        [orjson.loads(x) for x in (out / "manifest.jsonl").read_bytes().splitlines()]
        if (out / "manifest.jsonl").exists()
        else []
    )
    audio = sum(r["duration"] for r in rows)
    steady = steady_state(rows)["audio_seconds_per_second"]
    result = {
        "setting": spec,
        "slots": int(slots),
        "workers_per_slot": int(workers),
        "exit_code": done.returncode,
        "utterances": len(rows),
        "audio_seconds": round(audio, 1),
        "wall_seconds": round(wall, 1),
        "end_to_end_audio_s_per_s": round(audio / wall, 2),
        "steady_audio_s_per_s": round(steady, 2) if steady else None,
        "failed": summary.get("failed"),
        "stderr_tail": done.stderr[-1500:],
    }
    print(
        f"{spec}: {result['utterances']} utterances, {result['audio_seconds']} s audio in {result['wall_seconds']} s: "
        f"{result['end_to_end_audio_s_per_s']} audio s/s end to end, {result['steady_audio_s_per_s']} steady (exit "
        f"{done.returncode})",
        flush=True,
    )
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=["cpu:1x1", "cpu:2x1"], help="cpu:SLOTSxWORKERS")
    p.add_argument("--images", type=int, default=12, help="conversations to speak (the sample has 30)")
    p.add_argument(
        "--text", default=str(DEFAULT_TEXT), help="conversations to speak, in any input format of preprocess.py"
    )
    p.add_argument("--out", help="write the figures here as JSON")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="convtts-cpu-bench-"))
    try:
        source = work / "input.json"
        write_input(Path(args.text), args.images, source)
        results = [run_setting(spec, source, work) for spec in args.settings]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| slots x workers | utterances | audio s | wall s | audio s/s end to end | audio s/s steady | exit |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['slots']} x {r['workers_per_slot']} | {r['utterances']} | {r['audio_seconds']} | "
            f"{r['wall_seconds']} | "
            f"{r['end_to_end_audio_s_per_s']} | {r['steady_audio_s_per_s']} | {r['exit_code']} |"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_bytes(
            orjson.dumps({"cpu_count": os.cpu_count(), "results": results}, option=orjson.OPT_INDENT_2)
        )
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
