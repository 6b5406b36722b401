#!/usr/bin/env python3
"""One CosyVoice worker, batched: audio seconds per second and where the time goes, per batch size.

Loads the model once per batch size (as a worker does), speaks the same segments (cleaned and
split as the planner does) through synthesize_many, and reports throughput, peak GPU memory, and
the time in the LLM prefill, decode steps, sampling, flow and vocoder (CUDA-synchronised timers,
which slow the run a little; --no-stages for the clean figure). Batch size 1 takes upstream's own
one-at-a-time path, the baseline.

    python bench/batch_engine.py --model-dir /tmp/cv300m --batch-sizes 1,16,32,64 --utterances 256 --out r.json
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import orjson

from sample_text import DEFAULT_TEXT, QUESTIONS, ANSWERS, read_conversations, turn_texts  # bench/ is on sys.path

STAGES = ("_prefill", "_step", "_sample", "_vocode")


def segments(text_file: str, max_words: int, count: int) -> list[str]:
    from convtts.plan.textclean import clean, split_segments

    out = []
    while len(out) < count:
        for text in turn_texts(read_conversations(text_file), QUESTIONS + ANSWERS):
            cleaned, _ = clean(text)
            out += split_segments(cleaned, max_words) if cleaned else []
    return out[:count]


def timed_stages(engine_cls, totals: dict):
    """Wrap the engine's stages with synchronised timers; returns a function that undoes it."""
    import torch

    originals = {name: getattr(engine_cls, name) for name in STAGES}

    def wrap(name, fn):
        def timed(*args, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                totals[name] += time.perf_counter() - started
        return timed

    for name, fn in originals.items():
        setattr(engine_cls, name, wrap(name, fn))
    return lambda: [setattr(engine_cls, n, f) for n, f in originals.items()]


def measure(args, batch: int, texts: list[str]) -> dict:
    import torch

    from convtts.speak.cosyvoice.backend import CosyVoiceBackend
    from convtts.speak.cosyvoice.engine.engine import BatchEngine
    from convtts.config import load_config

    config = load_config(args.config, [f"tts.cosyvoice.model_dir={args.model_dir}", f"tts.cosyvoice.batch_size={batch}"])
    backend = CosyVoiceBackend(config)
    speaker = config.speakers.voices[0]
    rate = backend.sample_rate
    totals: dict = defaultdict(float)
    undo = timed_stages(BatchEngine, totals) if args.stages and batch > 1 else (lambda: None)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    warm = texts[: max(2, batch // 4)]
    _speak(backend, warm, speaker, batch)  # first calls pay for kernel selection and the allocator
    totals.clear()
    started = time.perf_counter()
    audio = _speak(backend, texts, speaker, batch)
    wall = time.perf_counter() - started
    undo()
    peak = torch.cuda.max_memory_reserved() / 2**20 if torch.cuda.is_available() else 0.0
    backend.close()
    seconds = audio / rate
    report = {"batch_size": batch, "utterances": len(texts), "audio_seconds": round(seconds, 2), "wall_seconds": round(wall, 2),
              "audio_seconds_per_second": round(seconds / wall, 3), "peak_reserved_mb": round(peak),
              "stage_seconds": {k.strip("_"): round(v, 2) for k, v in totals.items()}}
    print(orjson.dumps(report).decode(), flush=True)
    return report


def _speak(backend, texts: list[str], speaker: str, batch: int) -> int:
    if batch <= 1:
        return sum(len(backend.synthesize(t, speaker, 1000 + i)) for i, t in enumerate(texts))
    total = 0
    for _, audio in backend.synthesize_many((i, t, speaker, 1000 + i) for i, t in enumerate(texts)):
        if isinstance(audio, BaseException):
            raise audio
        total += len(audio)
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs" / "cosyvoice.yaml"))
    p.add_argument("--text", default=str(DEFAULT_TEXT))
    p.add_argument("--batch-sizes", default="1,16,32,64")
    p.add_argument("--utterances", type=int, default=256, help="per batch size (batch size 1 speaks a sixteenth)")
    p.add_argument("--max-words", type=int, default=10)
    p.add_argument("--no-stages", dest="stages", action="store_false")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    reports = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        count = args.utterances if batch > 1 else max(8, args.utterances // 16)
        reports.append(measure(args, batch, segments(args.text, args.max_words, count)))
        Path(args.out).write_bytes(orjson.dumps({"max_words": args.max_words, "reports": reports}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
