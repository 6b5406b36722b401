#!/usr/bin/env python3
"""Where one CosyVoice worker's time goes on the GPU: text frontend, LLM decode, flow matching, vocoder.

Loads the model the way a worker does (our backend), speaks N utterances, and times each stage
with CUDA synchronisation at its edges; then runs torch.profiler over a few utterances to count
kernel launches and GPU-busy time per LLM token.

    python bench/profile_worker.py --model-dir /tmp/cv300m --fp16 --utterances 20 --out profile.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import orjson

from sample_text import ANSWERS, DEFAULT_TEXT, read_conversations, turn_texts  # bench/ is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")


class StageTimer:
    """Wraps upstream's stage methods in place; each call's wall time, with the GPU drained."""

    def __init__(self, torch):
        self.seconds, self.calls, self.tokens = defaultdict(float), defaultdict(int), 0
        self.sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def wrap(self, owner, attr: str, stage: str, generator: bool = False) -> None:
        inner = getattr(owner, attr)
        timer = self

        def timed(*args, **kwargs):
            timer.sync()
            start = time.perf_counter()
            result = inner(*args, **kwargs)
            timer.sync()
            timer.seconds[stage] += time.perf_counter() - start
            timer.calls[stage] += 1
            return result

        def timed_generator(*args, **kwargs):
            timer.sync()
            start = time.perf_counter()
            for token in inner(*args, **kwargs):
                timer.tokens += 1
                yield token
            timer.sync()
            timer.seconds[stage] += time.perf_counter() - start
            timer.calls[stage] += 1

        setattr(owner, attr, timed_generator if generator else timed)


def sentences(path: Path, count: int) -> list[str]:
    """Answers as the pipeline speaks them: cleaned, in segments of 8 to 24 words."""
    from convtts.plan.textclean import clean, split_segments

    out = []
    for answer in turn_texts(read_conversations(path), ANSWERS):
        text, problem = clean(answer)
        if problem is None:
            out += [piece for piece in split_segments(text, 24) if len(piece.split()) >= 8]
    return out[:count]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--utterances", type=int, default=20)
    p.add_argument(
        "--text",
        default=str(DEFAULT_TEXT),
        help="conversations whose answers are spoken, in any input format of preprocess.py",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch

    from convtts.config import load_config
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    config = load_config(
        REPO / "configs" / "cosyvoice.yaml",
        [f"tts.cosyvoice.model_dir={args.model_dir}", f"tts.cosyvoice.fp16={str(args.fp16).lower()}"],
    )
    backend = CosyVoiceBackend(config)
    upstream = backend.model
    texts = sentences(Path(args.text), args.utterances + 3)
    for text in texts[:3]:  # warm-up: cuDNN autotuning, allocator growth
        backend.synthesize(text, "英文女", 1)

    timer = StageTimer(torch)
    timer.wrap(upstream.frontend, "text_normalize", "text frontend (normalise, split)")
    timer.wrap(upstream.frontend, "frontend_sft", "text frontend (tokenise, speaker)")
    timer.wrap(upstream.model.llm, "inference", "llm decode", generator=True)
    timer.wrap(upstream.model.flow, "inference", "flow matching")
    timer.wrap(upstream.model.hift, "inference", "vocoder (hift)")
    audio_seconds, started = 0.0, time.perf_counter()
    for i, text in enumerate(texts[3:]):
        audio_seconds += len(backend.synthesize(text, "英文女", 100 + i)) / backend.sample_rate
    wall = time.perf_counter() - started
    stages = {
        k: {
            "seconds": round(v, 3),
            "share": round(v / wall, 3),
            "per_utterance_ms": round(1000 * v / len(texts[3:]), 1),
        }
        for k, v in timer.seconds.items()
    }
    stages["other (python, threads, copies)"] = {
        "seconds": round(wall - sum(timer.seconds.values()), 3),
        "share": round(1 - sum(timer.seconds.values()) / wall, 3),
    }
    report = {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "fp16": args.fp16,
        "utterances": len(texts[3:]),
        "audio_seconds": round(audio_seconds, 2),
        "wall_seconds": round(wall, 3),
        "audio_seconds_per_second": round(audio_seconds / wall, 3),
        "llm_tokens": timer.tokens,
        "llm_ms_per_token": round(1000 * timer.seconds["llm decode"] / max(timer.tokens, 1), 2),
        "stages": stages,
        "kernels": kernel_profile(torch, backend, texts[3:6], timer),
    }
    Path(args.out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0


def kernel_profile(torch, backend, texts: list[str], timer: StageTimer) -> dict:
    """Kernel launches and GPU-busy time per LLM token over a few utterances, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    tokens_before = timer.tokens
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for i, text in enumerate(texts):
            backend.synthesize(text, "英文女", 500 + i)
        timer.sync()
        wall = time.perf_counter() - started
    tokens = max(timer.tokens - tokens_before, 1)
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    gpu_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return {
        "wall_seconds": round(wall, 3),
        "llm_tokens": tokens,
        "kernel_launches": launches,
        "launches_per_llm_token": round(launches / tokens, 1),
        "gpu_busy_seconds": round(gpu_us / 1e6, 3),
        "gpu_busy_share": round(gpu_us / 1e6 / wall, 3),
        "top_cpu_ops": [[e.key, e.count, round(e.self_cpu_time_total / 1e3, 1)] for e in top],
    }


if __name__ == "__main__":
    sys.exit(main())
