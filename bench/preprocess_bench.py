#!/usr/bin/env python3
"""Benchmark preprocess.py on a generated LLaVA-style file of a million conversations: wall time, peak memory."""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import orjson

from sample_text import ANSWERS, DEFAULT_TEXT, QUESTIONS, read_conversations, turn_texts  # bench/ is on sys.path

REPO = Path(__file__).resolve().parents[1]


def sentence_pool(text_file: Path) -> tuple[list[str], list[str]]:
    """Questions and answer sentences of a conversations file (the repository's LLaVA-style sample by default)."""
    records = read_conversations(text_file)
    questions, sentences = turn_texts(records, QUESTIONS), []
    for answer in turn_texts(records, ANSWERS):
        for paragraph in answer.split("\n"):
            # A numbered item such as '1. **Pick a sunny spot.** ...' stays whole; prose is cut into sentences.
            sentences += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", paragraph.strip()) if s]
    return questions, sentences


def answer(rng: random.Random, sentences: list[str]) -> str:
    """One to nine sentences; now and then a numbered list or some markdown, as GPT-4 writes them."""
    picked = rng.sample(sentences, rng.randint(1, 9))
    style = rng.random()
    if style < 0.15:
        intro, items = picked[0], picked[1:] or picked
        return intro + "\n\n" + "\n".join(f"{n}. {s}" for n, s in enumerate(items, 1))
    if style < 0.2:
        return "**Summary:** " + " ".join(picked)
    return " ".join(picked)


def conversation(index: int, rng: random.Random, questions: list[str], sentences: list[str]) -> dict:
    turns = []
    for exchange in range(rng.choice((1, 1, 2, 2, 3, 4))):
        question = rng.choice(questions)
        turns.append({"from": "human", "value": f"<image>\n{question}" if exchange == 0 else question})
        turns.append({"from": "gpt", "value": answer(rng, sentences)})
    return {"id": f"{index:012d}", "image": f"COCO_train2014_{index:012d}.jpg", "conversations": turns}


def generate(path: Path, count: int, jsonl: bool, seed: int, text_file: Path) -> None:
    questions, sentences = sentence_pool(text_file)
    rng = random.Random(seed)
    with open(path, "wb", buffering=1 << 22) as fh:
        fh.write(b"" if jsonl else b"[")
        for i in range(count):
            data = orjson.dumps(conversation(i, rng, questions, sentences))
            fh.write(data + b"\n" if jsonl else (b", " if i else b"") + data)
        fh.write(b"" if jsonl else b"]\n")


def tree_rss_mb(root: int) -> float:
    """Resident memory of a process and all its descendants (the planner's worker processes), from /proc."""
    parents, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            pages = int(Path(f"/proc/{entry}/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        rss[int(entry)] = pages * os.sysconf("SC_PAGE_SIZE")
    members, grew = {root}, True
    while grew:
        new = {pid for pid, parent in parents.items() if parent in members and pid not in members}
        members |= new
        grew = bool(new)
    return sum(rss.get(pid, 0) for pid in members) / 2**20


def sample_tree(pid: int, peak: list[float], stop: threading.Event) -> None:
    while not stop.wait(0.25):
        peak[0] = max(peak[0], tree_rss_mb(pid))


def run_preprocess(source: Path, out: Path, extra: list[str]) -> dict:
    """Run the real entry script: peak RSS of the biggest process from wait4, of all together by sampling."""
    cmd = [sys.executable, str(REPO / "preprocess.py"), "--input", str(source), "--output-dir", str(out), *extra]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak, stop = [0.0], threading.Event()
    sampler = threading.Thread(target=sample_tree, args=(proc.pid, peak, stop), daemon=True)
    sampler.start()
    output = proc.stdout.read().decode(errors="replace")
    stop.set()
    sampler.join()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    plan = orjson.loads((out / "plan" / "plan.json").read_bytes()) if proc.returncode == 0 else {}
    plan_bytes = sum(p.stat().st_size for p in (out / "plan").rglob("*") if p.is_file()) if plan else 0
    return {
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "peak_tree_rss_mb": round(peak[0], 1),
        "user_s": round(usage.ru_utime, 1),
        "sys_s": round(usage.ru_stime, 1),
        "conversations": plan.get("conversations"),
        "segments": plan.get("segments"),
        "words": plan.get("words"),
        "estimated_hours": plan.get("estimated_hours"),
        "shards": len(plan.get("shards", [])),
        "plan_bytes": plan_bytes,
        **phase_times(output),
        "log_tail": output[-2000:],
    }


def phase_times(log: str) -> dict:
    """Seconds spent reading (ids, spans) and then writing shards, from the planner's log stamps."""
    stamps = {}
    for line in log.splitlines():
        for key, marker in (("start", "INFO"), ("selected", "selected"), ("done", "plan made")):
            if marker in line and key not in stamps:
                stamps[key] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    if len(stamps) < 3:
        return {}
    return {
        "index_s": round((stamps["selected"] - stamps["start"]).total_seconds(), 1),
        "shards_s": round((stamps["done"] - stamps["selected"]).total_seconds(), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="/tmp", help="where the big input and plan go (deleted afterwards)")
    parser.add_argument("--conversations", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("array", "jsonl", "both"), default="array")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--text", default=str(DEFAULT_TEXT), help="conversations whose sentences the generated file reuses"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="passed on to preprocess.py")
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="convtts-bench-", dir=args.workdir))
    results = []
    try:
        for fmt in ("array", "jsonl") if args.format == "both" else (args.format,):
            source = root / f"conversations.{'jsonl' if fmt == 'jsonl' else 'json'}"
            started = time.perf_counter()
            generate(source, args.conversations, fmt == "jsonl", args.seed, Path(args.text))
            generated = time.perf_counter() - started
            extra = [a for o in args.overrides for a in ("--set", o)]
            result = {
                "format": fmt,
                "input_bytes": source.stat().st_size,
                "generate_s": round(generated, 1),
                **run_preprocess(source, root / f"out-{fmt}", extra),
            }
            results.append(result)
            print(
                f"{fmt}: {result['input_bytes'] / 1e9:.2f} GB, {result['conversations']} conversations -> "
                f"{result['segments']} segments in {result['shards']} shards; preprocess {result['wall_s']} s wall, "
                f"peak RSS {result['peak_rss_mb']} MB (all processes {result['peak_tree_rss_mb']} MB), plan "
                f"{result['plan_bytes'] / 1e9:.2f} GB (rc {result['rc']})"
            )
            if result["rc"] != 0:
                print(result["log_tail"], file=sys.stderr)
            if not args.keep:  # the next format needs the disk space
                source.unlink()
                shutil.rmtree(root / f"out-{fmt}", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.out:
        Path(args.out).write_bytes(
            orjson.dumps({"runs": results, "cpu_count": os.cpu_count()}, option=orjson.OPT_INDENT_2)
        )
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
