#!/usr/bin/env python3
"""export.py speed: rows per second for each format on an output of a few thousand segments.

The output is spoken quickly by bench/noise_voice.py (seeded noise under a tone, 22050 Hz, as long as
the text would take: audio that does not compress, like speech), from copies of the repository's
LLaVA-style sample under new ids. Each format is
exported into a fresh destination, then once more (everything up to date: the cost of a rerun).

    python bench/export_speed.py --copies 10 [--audio-format wav|flac] [--work /tmp/export-bench] [--out r.json]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("hf", "lhotse", "webdataset", "nemo")


def make_input(path: Path, copies: int) -> None:
    records = orjson.loads((REPO / "tests" / "data" / "llava_style.json").read_bytes())
    out = [{**r, "id": f"{r['id']}-c{copy}"} for copy in range(copies) for r in records]
    path.write_bytes(orjson.dumps(out))


def env() -> dict:
    extra = {"PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join([str(REPO / "bench"), str(REPO)])}
    return {**os.environ, **extra}


def speak(work: Path, copies: int, audio_format: str) -> Path:
    out = work / "out"
    make_input(work / "convs.json", copies)
    subprocess.run(
        [
            "bash",
            str(REPO / "run_all.sh"),
            "--input",
            str(work / "convs.json"),
            "--output-dir",
            str(out),
            "--log-dir",
            str(work / "log"),
            "--gpus",
            "cpu:1",
            "--set",
            "tts.backend=noise_voice:NoiseVoice",
            "--set",
            f"output.audio_format={audio_format}",
        ],
        env=env(),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def timed_export(out: Path, fmt: str, dest: Path, shard_rows: int) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system) and the closing line of one export process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "export.py"),
            str(out),
            "--format",
            fmt,
            "--dest",
            str(dest),
            "--shard-rows",
            str(shard_rows),
        ],
        env=env(),
        check=True,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--copies", type=int, default=10, help="copies of the 30-conversation sample (10: about 3,000 segments)"
    )
    parser.add_argument("--audio-format", default="wav", choices=("wav", "flac"))
    parser.add_argument("--shard-rows", type=int, default=1000)
    parser.add_argument("--work", default="/tmp/export-bench")
    parser.add_argument("--out")
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out = speak(work, args.copies, args.audio_format)
    rows = sum(1 for _ in open(out / "manifest.jsonl", "rb"))
    audio_mb = sum(p.stat().st_size for p in (out / "audio").rglob("*.*")) / 1e6
    print(
        f"{rows} rows, {audio_mb:.0f} MB of {args.audio_format} audio; --shard-rows {args.shard_rows}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    results = []
    for fmt in FORMATS:
        dest = work / "export" / fmt
        first, cpu, line = timed_export(out, fmt, dest, args.shard_rows)
        again, _, _ = timed_export(out, fmt, dest, args.shard_rows)
        size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) / 1e6
        results.append(
            {
                "format": fmt,
                "rows": rows,
                "seconds": round(first, 2),
                "rows_per_s": round(rows / first),
                "cpu_seconds": round(cpu, 2),
                "rerun_seconds": round(again, 2),
                "export_mb": round(size, 1),
                "line": line,
            }
        )
        print(
            f"{fmt:10s} {first:6.2f} s  {rows / first:7.0f} rows/s  cpu {cpu:5.2f} s  rerun {again:5.2f} s  "
            f"{size:7.1f} MB"
        )
    if args.out:
        Path(args.out).write_bytes(
            orjson.dumps(
                {"audio_format": args.audio_format, "audio_mb": round(audio_mb, 1), "results": results},
                option=orjson.OPT_INDENT_2,
            )
        )


if __name__ == "__main__":
    main()
