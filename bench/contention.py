#!/usr/bin/env python3
"""How long a worker's longest rows take while other workers load the same GPU, and what shortens it.

A short job ends with its longest rows: begun with the first batch, 96 of them (10 s of audio,
about 500 decode steps each) took 33-40 s on a busy H200, where one decode step of 96 rows alone
takes a few milliseconds. This measures that directly. A probe process (one worker's backend,
`--rows` rows) speaks the `--rows` longest segments of the README job's text once; beside it
`--loaders` processes speak the rest of that text over and over, as a job's other workers do
(decode steps, prefills, flow and vocoder passes). All run under one MPS daemon of their own,
started and stopped by convtts/run/mps.sh as run_all.sh does.

Cases (--cases, in order):
  alone     the probe with no loaders;
  loaded    with the loaders;
  high      with the loaders, the probe's work on a high-priority CUDA stream;
  pctN      with the loaders, each limited to N% of the GPU's SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE);
            the probe unlimited.

Per case: the probe's wall time, its decode steps and milliseconds a step, its engine stages, and
the loaders' audio seconds per second while the probe ran.

    python3 bench/contention.py --model-dir /tmp/cv300m --loaders 7 --cases alone,loaded,high,pct60 --out c.json
    python3 bench/contention.py --model-dir /tmp/tiny-cv --loaders 1 --rows 4 --cases alone,loaded --out /tmp/c.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from sample_text import read_conversations  # bench/ is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
TEXT = REPO / "bench" / "data" / "llava_gpt4_qa_30x3.jsonl"
SPEAKER_SEED = 1000


def segments(max_words: int) -> list[str]:
    """The README job's turns (bench/e2e.py's text), cleaned and split as the planner does."""
    from convtts.plan.textclean import clean, split_segments

    out = []
    for record in read_conversations(TEXT):
        for text in (record["instruction"], record["output"]):  # one turn each, as bench/e2e.py's job
            cleaned, _ = clean(text)
            out += split_segments(cleaned, max_words) if cleaned else []
    return out


def backend_for(args):
    from convtts.config import load_config
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    config = load_config(
        REPO / "configs" / "cosyvoice.yaml",
        [f"tts.cosyvoice.model_dir={args.model_dir}", f"tts.cosyvoice.batch_size={args.rows}", *args.set],
    )
    return CosyVoiceBackend(config), config.speakers.voices[0]


def speak(backend, speaker: str, texts) -> float:
    """Audio seconds of `texts` (an iterable of (key, text)), spoken through the batched engine."""
    samples = 0
    for _, audio in backend.synthesize_many((k, t, speaker, SPEAKER_SEED + k) for k, t in texts):
        if isinstance(audio, BaseException):
            raise audio
        samples += len(audio)
    return samples / backend.sample_rate


def wait_for(path: Path, stop: Path | None = None) -> bool:
    while not path.exists():
        if stop is not None and stop.exists():
            return False
        time.sleep(0.02)
    return True


def run_probe(args, work: Path) -> None:
    import torch

    backend, speaker = backend_for(args)
    texts = sorted(segments(args.max_words), key=len, reverse=True)
    speak(backend, speaker, enumerate(texts[-args.rows :]))  # graphs and kernels chosen on short rows
    (work / "probe.ready").touch()
    wait_for(work / "go")
    engine = backend.engine
    before = {k: (engine.timer.seconds[k], engine.timer.calls[k]) for k in list(engine.timer.seconds)}
    cuda = torch.cuda.is_available()
    stream = torch.cuda.Stream(priority=-1) if cuda and args.priority == "high" else None
    started = time.perf_counter()
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        audio = speak(backend, speaker, enumerate(texts[: args.rows]))
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - started
    stages = {
        k: {
            "seconds": round(engine.timer.seconds[k] - before.get(k, (0, 0))[0], 2),
            "calls": engine.timer.calls[k] - before.get(k, (0, 0))[1],
        }
        for k in engine.timer.seconds
    }
    steps = stages.get("step", {}).get("calls", 0)
    report = {
        "wall_seconds": round(wall, 2),
        "audio_seconds": round(audio, 1),
        "decode_steps": steps,
        "ms_per_step": round(1000 * wall / steps, 1) if steps else None,
        "stream_priority": stream.priority if stream is not None else 0,
        "stages": stages,
    }
    (work / "probe.json").write_bytes(orjson.dumps(report))


def run_loader(args, work: Path, index: int) -> None:
    backend, speaker = backend_for(args)
    texts = segments(args.max_words)
    random.Random(index).shuffle(texts)
    speak(backend, speaker, enumerate(texts[: args.rows]))
    (work / f"loader-{index}.ready").touch()
    stop, go, done = work / "stop", work / "go", work / "probe.done"
    marks: dict[str, float] = {}
    audio = 0.0

    def feed():
        k = 0
        while not stop.exists():
            yield k, texts[k % len(texts)]
            k += 1

    for _, sound in backend.synthesize_many((k, t, speaker, SPEAKER_SEED + k) for k, t in feed()):
        if isinstance(sound, BaseException):
            raise sound
        now = time.perf_counter()
        if go.exists() and "go" not in marks:
            marks["go"], audio = now, 0.0
        if done.exists() and "done" not in marks and "go" in marks:
            marks["done"] = now
            break
        audio += len(sound) / backend.sample_rate
    span = marks.get("done", time.perf_counter()) - marks.get("go", time.perf_counter())
    report = {"audio_seconds": round(audio, 1), "seconds": round(span, 2)}
    (work / f"loader-{index}.json").write_bytes(orjson.dumps(report))


def child(args, role: str, work: Path, env: dict, extra: list[str]) -> subprocess.Popen:
    command = [
        sys.executable,
        __file__,
        "--role",
        role,
        "--work",
        str(work),
        "--model-dir",
        args.model_dir,
        "--rows",
        str(args.rows),
        "--max-words",
        str(args.max_words),
        "--out",
        args.out,
        *extra,
    ]
    command += [item for s in args.set for item in ("--set", s)]
    log = open(work / f"{role}{'-'.join([''] + extra[-1:])}.log", "wb")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_case(args, case: str, root: Path, env: dict) -> dict:
    work = root / case
    work.mkdir(parents=True)
    loaders = 0 if case == "alone" else args.loaders
    loader_env = dict(env)
    if case.startswith("pct"):
        loader_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = case[3:]
    priority = "high" if case == "high" else "normal"
    procs = [child(args, "loader", work, loader_env, ["--index", str(i)]) for i in range(loaders)]
    probe = child(args, "probe", work, env, ["--priority", priority])
    started = time.perf_counter()
    ready = [work / "probe.ready"] + [work / f"loader-{i}.ready" for i in range(loaders)]
    while not all(p.exists() for p in ready):
        if any(p.poll() not in (None, 0) for p in procs + [probe]):
            raise SystemExit(f"{case}: a process failed while loading; see {work}/*.log")
        time.sleep(0.1)
    time.sleep(args.settle)
    (work / "go").touch()
    if probe.wait() != 0:
        raise SystemExit(f"{case}: the probe failed; see {work}/probe-*.log")
    (work / "probe.done").touch()
    (work / "stop").touch()
    for p in procs:
        p.wait(timeout=300)
    report = {"case": case, "loaders": loaders, "probe": orjson.loads((work / "probe.json").read_bytes())}
    figures = [orjson.loads((work / f"loader-{i}.json").read_bytes()) for i in range(loaders)]
    if figures:
        seconds = max(f["seconds"] for f in figures) or 1.0
        report["loaders_audio_s_per_s"] = round(sum(f["audio_seconds"] for f in figures) / seconds, 1)
    report["case_seconds"] = round(time.perf_counter() - started, 1)
    print(orjson.dumps(report).decode(), flush=True)
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--loaders", type=int, default=7)
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--cases", default="alone,loaded,high")
    p.add_argument("--max-words", type=int, default=30)
    p.add_argument("--settle", type=float, default=5.0, help="seconds the loaders run before the probe begins")
    p.add_argument("--set", action="append", default=[], help="a config override for every process")
    p.add_argument("--out", required=True)
    p.add_argument("--role", choices=("main", "probe", "loader"), default="main", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--priority", default="normal", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "probe":
        run_probe(args, Path(args.work))
        return 0
    if args.role == "loader":
        run_loader(args, Path(args.work), args.index)
        return 0
    from convtts.cluster.ray_actors import NodeMPS  # mps.sh's start and stop, as a Ray node's slots use them

    root = Path(tempfile.mkdtemp(prefix="convtts-contention-"))
    mps = NodeMPS()
    reach, said = mps.start("on", str(root / "mps"))
    print(said, flush=True)
    env = {**os.environ, **reach}
    reports = []
    try:
        for case in args.cases.split(","):
            reports.append(run_case(args, case, root, env))
            Path(args.out).write_bytes(
                orjson.dumps({"rows": args.rows, "reports": reports}, option=orjson.OPT_INDENT_2)
            )
    finally:
        mps.stop()
    print(f"figures in {args.out}; logs in {root}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
