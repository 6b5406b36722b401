#!/usr/bin/env python3
"""A finished job of N conversations, made without speaking it, then the reruns a cron line makes.

The output is what run_all.sh leaves behind, every file of it: a real plan (preprocess.py on
generated LLaVA-like conversations), a real tiny WAV per row written by the workers' own writer
(utterance.write_audio's atomic write, at TINY_SECONDS), a worker's manifest file per shard with
rows shaped as the workers write them, the shards' done markers written by the slot's own code
(pieces.WorkQueue closing each shard), and the merged outputs (convtts.results.merge). Then,
each under /usr/bin/time -v with the silence voice, as the README runs it:

  noop     run_all.sh again on the finished output: nothing to speak
  resume   the audio of every 100th shard (1% of the rows) deleted, then run_all.sh

and per run: wall time, exit code, when the slots decided (from the plan's end, plan.exit, to the
slot's first line about its work), the merge's time, per-row costs and their extrapolation to 1M
conversations (linear in rows).

    python bench/scale.py --conversations 10000 --keep /tmp/scale-10k   # build, time, keep
    python bench/scale.py --reuse /tmp/scale-10k                       # time an output built before
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import orjson
import soundfile as sf

from figures import report
from preprocess_bench import generate  # bench/ is on sys.path
from sample_text import DEFAULT_TEXT

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from convtts.config import load_config
from convtts.run.pieces import WorkQueue
from convtts.run.utterance import Context, Settings, manifest_row
from convtts.speak.silence import SilenceBackend
from convtts.state.layout import Layout, WorkListing
from convtts.state.shardio import write_atomic

TINY_SECONDS = 0.05  # each row's audio: 1.3M full-length files would not fit the disk
RESUME_EVERY = 100  # the resume run loses the audio of every 100th shard
MILLION = 1_000_000
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", re.M)


def make_plan(root: Path, conversations: int) -> tuple[Path, Path]:
    source, out = root / "conversations.json", root / "out"
    generate(source, conversations, False, 0, Path(DEFAULT_TEXT))
    subprocess.run(
        [sys.executable, str(REPO / "preprocess.py"), "--input", str(source), "--output-dir", str(out)]
        + ["--set", "tts.backend=silence"],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env(),
    )
    return source, out


def env() -> dict:
    return {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(REPO)}


def tiny_wav(rate: int, subtype: str, fmt: str) -> tuple[bytes, int]:
    samples = int(TINY_SECONDS * rate)
    encoded = io.BytesIO()
    sf.write(encoded, np.zeros(samples, np.float32), rate, subtype=subtype, format=fmt.upper())
    return encoded.getvalue(), samples


def write_work(layout: Layout, run_id: str) -> int:
    """Audio and a worker's manifest for every planned row of every shard; returns the rows."""
    config = load_config(layout.config_file)
    backend = SilenceBackend(config)
    ctx = Context(backend, None, layout, Settings.of(config, run_id))
    data, samples = tiny_wav(backend.sample_rate, config.output.subtype, config.output.audio_format)
    audio = np.zeros(samples, np.float32)
    layout.work_dir.mkdir(parents=True, exist_ok=True)
    rows = 0
    for shard in layout.shard_names():
        folder = layout.audio_dir(shard)
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for segment in map(orjson.loads, layout.shard_file(shard).read_bytes().splitlines()):
            final = folder / f"{segment['id']}.{config.output.audio_format}"
            write_atomic(final, data)  # as utterance.write_audio writes it, encoded once
            row = manifest_row(ctx, segment, str(final.relative_to(layout.root)), audio, 1, 1234 + rows, 0.001)
            row.update(worker="slot0-w0", pid=os.getpid(), finished=time.time(), rss_mb=400.0, gpu_mb=0.0)
            lines.append(orjson.dumps(row) + b"\n")
            rows += 1
        write_atomic(layout.manifest(shard, "w0"), b"".join(lines))
    return rows


def mark_done(layout: Layout, run_id: str) -> None:
    """The done markers, written by the slot's queue as it opens each shard and finds every id spoken."""
    queue = WorkQueue(layout, layout.shard_names(), run_id, 1, WorkListing(layout))
    while queue.waiting:
        if queue.open_until_pending() is not None:
            raise RuntimeError("a shard has ids without audio")


def build(root: Path, conversations: int) -> dict:
    started = time.perf_counter()
    source, out = make_plan(root, conversations)
    planned = time.perf_counter()
    layout = Layout(out)
    run_id = time.strftime("%Y%m%dT%H%M%S") + "-bench"
    rows = write_work(layout, run_id)
    written = time.perf_counter()
    mark_done(layout, run_id)
    marked = time.perf_counter()
    subprocess.run([sys.executable, "-m", "convtts.results.merge", str(out)], check=True, env=env())
    return {
        "rows": rows,
        "shards": len(layout.shard_names()),
        "plan_s": round(planned - started, 1),
        "write_s": round(written - planned, 1),
        "mark_s": round(marked - written, 1),
        "merge_s": round(time.perf_counter() - marked, 1),
    }


def stamp(line: str) -> float:
    return datetime.strptime(line, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def slot_decided(log: Path) -> float | None:
    """When the slot's first line about its work was written: 'already complete', or what it has to do."""
    for line in log.read_text(errors="replace").splitlines():
        match = STAMP.match(line)
        if match and re.search(r"slot \d+: (.* already complete|.* to do in )", line):
            return stamp(match.group(1))
    return None


def rerun(root: Path, name: str, gpus: str) -> dict:
    """run_all.sh on the output, as the README's cron line runs it, under /usr/bin/time -v."""
    logs = root / f"log-{name}"
    shutil.rmtree(logs, ignore_errors=True)  # a rerun of the bench on a kept folder: this run's logs alone
    cmd = ["/usr/bin/time", "-v", "bash", str(REPO / "run_all.sh"), "--input", str(root / "conversations.json")]
    cmd += ["--output-dir", str(root / "out"), "--gpus", gpus, "--set", "tts.backend=silence", "--log-dir", str(logs)]
    started = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env(), stdin=subprocess.DEVNULL)
    ended = time.time()
    figures = {"rc": result.returncode, "wall_s": round(ended - started, 2), "peak_rss_mb": rss_mb(result.stderr)}
    plan_exit = next(logs.rglob("plan.exit"), None)
    if plan_exit is not None:
        _rc, plan_started, plan_ended = plan_exit.read_text().split()
        figures["plan_s"] = round(float(plan_ended) - float(plan_started), 2)
        slots = [p for p in logs.rglob("slot-*.log") if re.fullmatch(r"slot-\d+\.log", p.name)]
        decided = [slot_decided(p) for p in slots]
        if slots and all(decided):
            figures["slots_decide_s"] = round(max(decided) - float(plan_ended), 2)
        # the slots' last lines to the run's end: the merge, then run_all.sh's exit
        ended_slots = max(stamp(STAMP.findall(p.read_text(errors="replace"))[-1]) for p in slots)
        figures["merge_and_exit_s"] = round(ended - ended_slots, 2)
    if result.returncode:
        figures["stderr_tail"] = result.stderr[-1500:]
    return figures


def rss_mb(time_v: str) -> float:
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", time_v)
    return round(int(match.group(1)) / 1024, 1) if match else 0.0


def delete_slice(layout: Layout) -> int:
    """The audio of every RESUME_EVERY-th shard, from the first; returns the files deleted."""
    deleted = 0
    for shard in layout.shard_names()[::RESUME_EVERY]:
        for path in layout.audio_dir(shard).iterdir():
            path.unlink()
            deleted += 1
    return deleted


def per_row(figures: dict, rows: int, conversations: int) -> dict:
    """Milliseconds a row of each timed span, and the span at 1M conversations, linear in rows."""
    scale = MILLION / conversations
    out = {}
    for key in ("wall_s", "slots_decide_s", "merge_and_exit_s"):
        if figures.get(key) is not None:
            out[key.replace("_s", "_ms_per_row")] = round(figures[key] / rows * 1000, 4)
            out[key.replace("_s", "_s_at_1M")] = round(figures[key] * scale, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--gpus", default="cpu:1", help="run_all.sh's --gpus for the reruns")
    parser.add_argument("--workdir", default="/tmp")
    parser.add_argument("--keep", help="build into this folder and keep it")
    parser.add_argument("--reuse", help="time the reruns on a folder built before with --keep")
    parser.add_argument("--no-resume", action="store_true", help="time the no-op rerun only")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()
    root = Path(args.reuse or args.keep or tempfile.mkdtemp(prefix="convtts-scale-", dir=args.workdir))
    try:
        if args.reuse:
            figures = orjson.loads((root / "built.json").read_bytes())
        else:
            root.mkdir(parents=True, exist_ok=True)
            figures = {"conversations": args.conversations, "built": build(root, args.conversations)}
            (root / "built.json").write_bytes(orjson.dumps(figures))
        rows, conversations = figures["built"]["rows"], figures["conversations"]
        layout = Layout(root / "out")
        noop = rerun(root, "noop", args.gpus)
        figures["noop"] = {**noop, **per_row(noop, rows, conversations)}
        if not args.no_resume:
            deleted = delete_slice(layout)
            resume = rerun(root, "resume", args.gpus)
            missing = sum(not (layout.root / r["audio"]).is_file() for r in map(orjson.loads, read_lines(layout)))
            figures["resume"] = {
                "deleted": deleted,
                "missing_after": missing,
                **resume,
                **per_row(resume, rows, conversations),
            }
        figures.update(cpu_count=os.cpu_count(), load_average=os.getloadavg(), folder_entries=largest_folders(layout))
        report(figures, args.out)
        return 0 if noop["rc"] == 0 and figures.get("resume", {}).get("rc", 0) == 0 else 1
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(root, ignore_errors=True)


def read_lines(layout: Layout) -> list[bytes]:
    return layout.manifest_file.read_bytes().splitlines()


def largest_folders(layout: Layout) -> dict:
    """The most entries a folder holds, in each tree that grows with the job (its folders of a
    thousand shards included)."""
    trees = (("plan/shards", layout.shards_dir), ("work", layout.work_dir), ("audio", layout.audio_root))
    trees += (("merge", layout.merge_dir),)
    return {name: max(len(os.listdir(folder)) for folder, _, _ in os.walk(path)) for name, path in trees}


if __name__ == "__main__":
    sys.exit(main())
