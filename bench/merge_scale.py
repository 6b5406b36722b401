#!/usr/bin/env python3
"""The final merge at scale: a real plan of N generated LLaVA-like conversations, synthetic work files
shaped like the workers' (every field of a manifest row, one writer file and a stats file per shard),
then `python -m convtts.results.merge` under /usr/bin/time -v: wall time, peak RSS, output sizes.
The merge runs three times: first on work nobody merged yet, then again with nothing changed, then
after 1% of the shards' manifests were rewritten (the same rows, new files); then the report
(`python -m convtts.results.report`, skipped when matplotlib is missing) and a NeMo export, twice.

Audio: `--audio shared` points every row at one of four real WAV files (12M real files do not fit
a small disk), and merge runs with --no-audio-check, so the figure is the row handling alone;
`--audio distinct` writes one real short WAV per row and merges twice, with and without the check,
which gives the check's cost per file. The glob per shard that merge used to do is timed on the
finished work/ directory, for the old figure.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import soundfile as sf

from figures import report
from preprocess_bench import generate  # bench/ is on sys.path
from sample_text import DEFAULT_TEXT

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from convtts.run.utterance import MANIFEST_FIELDS
from convtts.state.layout import Layout

RATE = 22050
SHARED_SECONDS = (2.0, 5.0, 9.0, 14.0)  # the shared files' lengths; rows take them in turn


def make_plan(root: Path, conversations: int) -> Path:
    source, out = root / "conversations.json", root / "out"
    generate(source, conversations, False, 0, DEFAULT_TEXT)
    subprocess.run(
        [
            sys.executable,
            str(REPO / "preprocess.py"),
            "--input",
            str(source),
            "--output-dir",
            str(out),
            "--set",
            "tts.backend=silence",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    source.unlink()  # merge never reads the input; the disk needs the room
    return out


def shared_audio(layout: Layout) -> list[tuple[str, int]]:
    folder = layout.audio_root / "shared"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for n, seconds in enumerate(SHARED_SECONDS):
        path = folder / f"{n}.wav"
        sf.write(path, np.zeros(int(seconds * RATE), np.float32), RATE, subtype="PCM_16")
        files.append((str(path.relative_to(layout.root)), int(seconds * RATE)))
    return files


def row(segment: dict, audio: str, samples: int, number: int) -> bytes:
    """A manifest row with the fields and value shapes utterance.manifest_row writes."""
    out = {k: segment.get(k) for k in MANIFEST_FIELDS}
    out.update(
        audio=audio,
        duration=round(samples / RATE, 4),
        num_samples=samples,
        sample_rate=RATE,
        backend="silence",
        status="ok",
        attempts=1,
        seed=1234567890 + number,
        synthesis_seconds=0.0123,
        run="20261123T130000-12345",
        worker="slot0-w0",
        pid=12345,
        finished=1795000000.0 + number / 1000,
        rss_mb=412.3,
        gpu_mb=0.0,
        since_build=number % 500,
    )
    return orjson.dumps(out) + b"\n"


def write_work(layout: Layout, distinct: bool, seconds: float = 0.5) -> int:
    """Work files for every planned segment (distinct audio files `seconds` long); returns the rows written."""
    layout.work_dir.mkdir(parents=True, exist_ok=True)
    shared = None if distinct else shared_audio(layout)
    silence = np.zeros(int(seconds * RATE), np.float32)
    total = 0
    for shard in layout.shard_names():
        lines = []
        for _number, segment in enumerate(map(orjson.loads, layout.shard_file(shard).read_bytes().splitlines())):
            if shared:
                audio, samples = shared[total % len(shared)]
            else:
                folder = layout.audio_dir(shard)
                folder.mkdir(parents=True, exist_ok=True)
                sf.write(folder / f"{segment['id']}.wav", silence, RATE, subtype="PCM_16")
                audio, samples = f"audio/{shard}/{segment['id']}.wav", len(silence)
            lines.append(row(segment, audio, samples, total))
            total += 1
        layout.manifest(shard, "w0").write_bytes(b"".join(lines))
        layout.stats(shard).write_bytes(
            orjson.dumps({"shard": shard, "segments": len(lines), "done": len(lines), "failed": 0, "pending": 0})
        )
    return total


def timed_merge(out: Path, *flags: str) -> dict:
    """/usr/bin/time -v of the real merge: wall seconds, peak RSS, CPU."""
    return timed(["-m", "convtts.results.merge", str(out), *flags])


def timed(args: list[str]) -> dict:
    """/usr/bin/time -v of `python ARGS`: wall seconds, peak RSS, CPU."""
    cmd = ["/usr/bin/time", "-v", sys.executable, *args]
    flags = args[3:] if args[0] == "-m" else args[2:]  # after the module or script and the output
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    report = result.stderr

    def field(name: str) -> str:
        match = re.search(rf"{re.escape(name)}: (.+)", report)
        return match.group(1).strip() if match else ""

    minutes, _, seconds = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").rpartition(":")
    wall = float(seconds) + sum(float(p) * 60 ** (i + 1) for i, p in enumerate(reversed(minutes.split(":"))) if p)
    return {
        "flags": list(flags),
        "rc": result.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(int(field("Maximum resident set size (kbytes)") or 0) / 1024, 1),
        "user_s": float(field("User time (seconds)") or 0),
        "sys_s": float(field("System time (seconds)") or 0),
        "stdout": result.stdout.strip(),
    }


def touch_shards(layout: Layout, share: float) -> int:
    """Rewrite `share` of the shards' manifests, each row as a later run's (a rerun that spoke them again)."""
    shards = layout.shard_names()
    picked = shards[:: max(int(1 / share), 1)]
    for shard in picked:
        for path in layout.manifests(shard):
            rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
            path.unlink()
            path.write_bytes(b"".join(orjson.dumps({**row, "run": "20261124T130000-54321"}) + b"\n" for row in rows))
    return len(picked)


def unit_sizes_seconds(layout: Layout) -> dict:
    """Export's unit sizes: from the merge's counts, and by counting every plan shard's lines."""
    from convtts.results.export import source

    started = time.perf_counter()
    source.unit_of_shard(layout, 5000)
    merged = time.perf_counter() - started
    started = time.perf_counter()
    for shard in layout.shard_names():
        source._count_lines(layout.shard_file(shard))
    return {"from_merge": round(merged, 3), "counted": round(time.perf_counter() - started, 3)}


def later_steps(layout: Layout, args, flags: list[str]) -> dict:
    """The merge again with the last one's flags (nothing changed, then 1% of the shards changed),
    the report, an export twice."""
    figures = {"merge_unchanged": timed_merge(layout.root, *flags)}
    figures["touched_shards"] = touch_shards(layout, 0.01)
    figures["merge_after_touch"] = timed_merge(layout.root, *flags)
    figures["export_unit_sizes_s"] = unit_sizes_seconds(layout)
    try:
        import matplotlib  # noqa: F401

        figures["report"] = timed(["-m", "convtts.results.report", str(layout.root)])
    except ImportError:
        figures["report"] = None
    if args.export:
        dest = layout.root / "export-nemo"
        export = [str(REPO / "export.py"), str(layout.root), "--format", "nemo", "--dest", str(dest)]
        figures["export"] = timed(export)
        figures["export_again"] = timed(export)
    return figures


def old_glob_seconds(layout: Layout, samples: int = 50) -> dict:
    """What the glob per shard (twice a shard) that merge did before WorkListing costs on this work/."""
    shards = layout.shard_names()
    picked = shards[:: max(len(shards) // samples, 1)][:samples]
    started = time.perf_counter()
    for shard in picked:
        glob.glob(str(layout.work_dir / f"{shard}.*.manifest.jsonl"))
        glob.glob(str(layout.work_dir / f"{shard}.*.failures.jsonl"))
    per_shard = (time.perf_counter() - started) / len(picked)
    return {
        "work_files": len(os.listdir(layout.work_dir)),
        "per_shard_s": round(per_shard, 4),
        "all_shards_s": round(per_shard * len(shards), 1),
    }


def sizes(layout: Layout) -> dict:
    def total(path: Path) -> int:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size

    return {
        "plan_bytes": total(layout.plan_dir),
        "work_bytes": total(layout.work_dir),
        "manifest_bytes": total(layout.manifest_file),
        "conversations_bytes": total(layout.conversations_file),
        "failures_bytes": total(layout.failures_file),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=1_000_000)
    parser.add_argument("--audio", choices=("shared", "distinct"), default="shared")
    parser.add_argument("--seconds", type=float, default=0.5, help="the length of each distinct audio file")
    parser.add_argument("--workdir", default="/tmp")
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("--export", action="store_true", help="time a NeMo export too (it checks every audio file)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="convtts-merge-", dir=args.workdir))
    try:
        started = time.perf_counter()
        layout = Layout(make_plan(root, args.conversations))
        plan = orjson.loads(layout.plan_file.read_bytes())
        rows = write_work(layout, args.audio == "distinct", args.seconds)
        result = {
            "conversations": args.conversations,
            "segments": plan["segments"],
            "shards": len(plan["shards"]),
            "rows": rows,
            "audio": args.audio,
            "setup_s": round(time.perf_counter() - started, 1),
            "merges": [timed_merge(layout.root, "--no-audio-check")],
        }
        if args.audio == "distinct":
            result["merges"].append(timed_merge(layout.root))
            unchecked, checked = result["merges"]
            cpu = (checked["user_s"] + checked["sys_s"]) - (unchecked["user_s"] + unchecked["sys_s"])
            result["audio_check_ms_per_file"] = round((checked["wall_s"] - unchecked["wall_s"]) / rows * 1000, 4)
            result["audio_check_cpu_ms_per_file"] = round(cpu / rows * 1000, 4)
        result.update(later_steps(layout, args, result["merges"][-1]["flags"]))
        result.update(
            sizes(layout), old_glob=old_glob_seconds(layout), cpu_count=os.cpu_count(), load_average=os.getloadavg()
        )
        report(result, args.out)
        return 0 if all(m["rc"] == 0 for m in result["merges"]) else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
