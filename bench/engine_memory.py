#!/usr/bin/env python3
"""A batched worker's GPU memory over thousands of utterances and many rebuilds, to set rebuild_every and max_gpu_mb.

Builds the backend, speaks --rebuild-every utterances through synthesize_many, releases it as a
worker does (convtts.run.worker_setup.release_backend), and again, until --utterances are spoken. Every
--sample-every utterances it records torch's allocated and reserved memory (what
workers.max_gpu_mb is compared with), the device's used memory (nvidia-smi: the CUDA context and
anything torch does not see) and the resident memory; per build the peaks, the build time and the
memory left after the release. The summary gives the largest peak, the growth from the first
builds to the last, and a max_gpu_mb that leaves 15% over the largest peak.

    python bench/engine_memory.py --version 1 --size full --rows 64 --utterances 5000 --rebuild-every 500 \\
        --set tts.cosyvoice.precision.llm=bf16 --out memory-v1.json
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import subprocess
import tempfile
import time
from pathlib import Path

import orjson

from batch_engine import CONFIGS, REPO, model_dir, prompt_overrides, segments  # bench/ is on sys.path
from sample_text import DEFAULT_TEXT

HEADROOM = 1.15  # the suggested max_gpu_mb over the largest reserved peak


def device_used_mb() -> float:
    """Memory in use on the visible GPU by every process (nvidia-smi); 0 where it cannot be read."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={visible}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0.0


def sample(torch, spoken: int) -> dict:
    from convtts.run.memory import rss_mb

    cuda = torch.cuda.is_available()
    return {
        "spoken": spoken,
        "allocated_mb": round(torch.cuda.memory_allocated() / 2**20) if cuda else 0,
        "reserved_mb": round(torch.cuda.memory_reserved() / 2**20) if cuda else 0,
        "device_used_mb": round(device_used_mb()),
        "rss_mb": round(rss_mb()),
    }


def one_build(args, config, texts, build: int, spoken: int) -> dict:
    """Build, speak this build's share, release; the build's figures."""
    import torch

    from convtts.run.worker_setup import release_backend
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    started = time.perf_counter()
    backend = CosyVoiceBackend(config)
    built = time.perf_counter() - started
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    samples = [sample(torch, spoken)]
    count = min(args.rebuild_every, args.utterances - spoken)
    speaker = config.speakers.voices[0]
    items = ((spoken + i, text, speaker, spoken + i) for i, text in zip(range(count), itertools.cycle(texts)))
    failures = 0
    for n, (_, audio) in enumerate(backend.synthesize_many(items), start=1):
        failures += isinstance(audio, BaseException)
        if n % args.sample_every == 0:
            samples.append(sample(torch, spoken + n))
    peak_reserved = torch.cuda.max_memory_reserved() / 2**20 if torch.cuda.is_available() else 0.0
    peak_allocated = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0.0
    samples.append(sample(torch, spoken + count))
    rows = backend.batch_rows
    release_backend(backend)
    del backend
    after = sample(torch, spoken + count)
    return {
        "build": build,
        "rows": rows,
        "utterances": count,
        "failures": failures,
        "build_seconds": round(built, 2),
        "seconds": round(time.perf_counter() - started, 2),
        "peak_reserved_mb": round(peak_reserved),
        "peak_allocated_mb": round(peak_allocated),
        "peak_device_used_mb": max(s["device_used_mb"] for s in samples),
        "after_release": after,
        "samples": samples,
    }


def summary(builds: list[dict]) -> dict:
    peaks = [b["peak_reserved_mb"] for b in builds]
    early, late = peaks[: max(1, len(peaks) // 3)], peaks[-max(1, len(peaks) // 3) :]
    return {
        "builds": len(builds),
        "utterances": sum(b["utterances"] for b in builds),
        "failures": sum(b["failures"] for b in builds),
        "largest_peak_reserved_mb": max(peaks),
        "largest_peak_device_used_mb": max(b["peak_device_used_mb"] for b in builds),
        "peak_growth_mb_first_to_last_third": round(sum(late) / len(late) - sum(early) / len(early)),
        "reserved_after_last_release_mb": builds[-1]["after_release"]["reserved_mb"],
        "suggested_max_gpu_mb": math.ceil(max(peaks) * HEADROOM / 100) * 100,
        "mean_build_seconds": round(sum(b["build_seconds"] for b in builds) / len(builds), 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", type=int, choices=(1, 2, 3), default=1)
    p.add_argument("--model-dir", help="a model directory (default: a random-weight model of --size, written once)")
    p.add_argument("--size", choices=("tiny", "full"), default="full")
    p.add_argument("--rows", type=int, default=64, help="tts.cosyvoice.batch_size (0: automatic, as for one worker)")
    p.add_argument("--utterances", type=int, default=5000)
    p.add_argument("--rebuild-every", type=int, default=500)
    p.add_argument("--sample-every", type=int, default=100)
    p.add_argument("--max-words", type=int, default=10)
    p.add_argument("--text", default=str(DEFAULT_TEXT))
    p.add_argument(
        "--set", action="append", default=[], help="a config override (tts.cosyvoice.precision.llm=bf16, ...)"
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()

    from convtts.config import load_config

    work = Path(tempfile.mkdtemp(prefix="convtts-memory-"))
    overrides = [
        f"tts.cosyvoice.model_dir={model_dir(args)}",
        f"text.max_words={args.max_words}",
        f"tts.cosyvoice.batch_size={args.rows}",
        *prompt_overrides(args, work),
        *args.set,
    ]
    config = load_config(REPO / "configs" / CONFIGS[args.version], overrides)
    texts = segments(args.text, args.max_words, 1000)
    builds: list[dict] = []
    spoken = 0
    while spoken < args.utterances:
        builds.append(one_build(args, config, texts, len(builds), spoken))
        spoken += builds[-1]["utterances"]
        line = {k: v for k, v in builds[-1].items() if k != "samples"}
        print(orjson.dumps(line).decode(), flush=True)
        report = {
            "settings": {
                "version": args.version,
                "rows": args.rows,
                "rebuild_every": args.rebuild_every,
                "max_words": args.max_words,
                "overrides": args.set,
            },
            "summary": summary(builds),
            "builds": builds,
        }
        Path(args.out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(summary(builds), option=orjson.OPT_INDENT_2).decode(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
