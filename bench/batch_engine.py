#!/usr/bin/env python3
"""One CosyVoice worker, batched: audio seconds per second and where the time goes, per decode setting and row count.

Loads the model once per (setting, rows), as a worker does, speaks the same segments (cleaned and
split as the planner does) through synthesize_many, and reports throughput, peak GPU memory, the
static KV cache, graphs captured, and the seconds in each stage of the engine's loop: prefill,
step (decode launches; with the CPU sampler, the whole step), sample (CPU sampler), read (GPU
sampler: waiting for a step's tokens, i.e. the GPU's decode time the CPU could not hide), flow
(flow and vocoder). With the CPU sampler every step synchronises anyway, so its stages are timed
with CUDA synchronised (exact); with the GPU sampler they are not (that would undo the overlap).

Settings (--settings, in order): today (upstream's layers over a padded cache, CPU sampler: the
engine before static caches), static (our step over the static cache, eager), graphs (+ CUDA
graphs), gpu-sampler (+ tokens drawn in the graph, next step launched before the last is read),
bf16 (+ LLM in bf16), tf32, compile (bf16 + torch.compile inside the graphs), upstream (batch
size 1: upstream's one-at-a-time path, a sixteenth of the utterances).

    python bench/batch_engine.py --version 1 --size full --batch-sizes 32,64 --out v1.json
    python bench/batch_engine.py --version 1 --size tiny --utterances 16 --out /tmp/tiny.json   # a dry run on CPU
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from sample_text import ANSWERS, DEFAULT_TEXT, QUESTIONS, read_conversations, turn_texts  # bench/ is on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CONFIGS = {1: "cosyvoice.yaml", 2: "cosyvoice2.yaml", 3: "cosyvoice3.yaml"}
V1_VOICES = ("英文女", "英文男")
PROMPT_TEXT = "This is a short prompt for a new voice, about ten words."
END_OF_PROMPT = "You are a helpful assistant.<|endofprompt|>"
GPU_DECODE = ["tts.cosyvoice.decode=static", "tts.cosyvoice.cuda_graphs=true", "tts.cosyvoice.sampler=gpu"]
SETTINGS = {
    "today": ["tts.cosyvoice.decode=upstream", "tts.cosyvoice.sampler=cpu"],
    "static": ["tts.cosyvoice.decode=static", "tts.cosyvoice.cuda_graphs=false", "tts.cosyvoice.sampler=cpu"],
    "graphs": ["tts.cosyvoice.decode=static", "tts.cosyvoice.cuda_graphs=true", "tts.cosyvoice.sampler=cpu"],
    "gpu-sampler": GPU_DECODE,
    "bf16": GPU_DECODE + ["tts.cosyvoice.precision.llm=bf16"],
    "tf32": GPU_DECODE + ["tts.cosyvoice.precision.llm=tf32"],
    "compile": GPU_DECODE + ["tts.cosyvoice.precision.llm=bf16", "tts.cosyvoice.compile=true"],
    "upstream": [],  # batch size 1
}


def segments(text_file: str, max_words: int, count: int) -> list[str]:
    from convtts.plan.textclean import clean, split_segments

    out = []
    while len(out) < count:
        for text in turn_texts(read_conversations(text_file), QUESTIONS + ANSWERS):
            cleaned, _ = clean(text)
            out += split_segments(cleaned, max_words) if cleaned else []
    return out[:count]


def model_dir(args) -> str:
    """The model to speak with: --model-dir, or a random-weight one of --size written for this run."""
    if args.model_dir:
        return args.model_dir
    out = Path(tempfile.gettempdir()) / f"convtts-bench-v{args.version}-{args.size}"
    if not (out / "convtts_model.json").is_file():
        command = [
            sys.executable,
            "-m",
            "convtts.testing.cosyvoice_model",
            "--version",
            str(args.version),
            "--size",
            args.size,
            "--out",
            str(out),
            "--tokens-per-text-token",
            "14" if args.version == 1 else "7",
        ]
        if args.version == 1:
            command += ["--speakers", ",".join(V1_VOICES)]
        subprocess.run(command, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    return str(out)


def prompt_overrides(args, work: Path) -> list[str]:
    """v2/v3: two zero-shot voices on a 4 s noise prompt (random weights care for its length only)."""
    if args.version == 1:
        return []
    import numpy as np
    import soundfile as sf

    wav = work / "prompt.wav"
    sf.write(wav, (np.random.default_rng(0).standard_normal(4 * 24000) * 0.05).astype("float32"), 24000)
    text = (END_OF_PROMPT if args.version == 3 else "") + PROMPT_TEXT
    return [f'tts.cosyvoice.prompts.{name}={{audio: "{wav}", text: "{text}"}}' for name in ("anna", "ben")]


def measure(args, setting: str, rows: int, texts: list[str], overrides: list[str]) -> dict:
    import torch

    from convtts.config import load_config
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    rows = 1 if setting == "upstream" else rows
    config = load_config(
        REPO / "configs" / CONFIGS[args.version], overrides + SETTINGS[setting] + [f"tts.cosyvoice.batch_size={rows}"]
    )
    backend = CosyVoiceBackend(config)
    speaker = config.speakers.voices[0]
    engine = backend.engine
    if engine is not None:
        engine.timer.sync = not engine.gpu_sampling
    _speak(backend, texts[: max(4, rows // 2)], speaker)  # kernels chosen, the first graphs captured
    graphs_before = _graphs(engine)
    if engine is not None:
        engine.timer.seconds.clear()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    samples = _speak(backend, texts if rows > 1 else texts[: max(8, len(texts) // 16)], speaker)
    wall = time.perf_counter() - started
    seconds = samples / backend.sample_rate
    report = {
        "setting": setting,
        "rows": rows,
        "utterances": len(texts) if rows > 1 else max(8, len(texts) // 16),
        "audio_seconds": round(seconds, 2),
        "wall_seconds": round(wall, 2),
        "audio_seconds_per_second": round(seconds / wall, 3),
        "peak_reserved_mb": round(torch.cuda.max_memory_reserved() / 2**20) if torch.cuda.is_available() else 0,
        "overrides": SETTINGS[setting],
    }
    if engine is not None:
        report.update(_engine_figures(engine, graphs_before))
    backend.close()
    print(orjson.dumps(report).decode(), flush=True)
    return report


def _graphs(engine) -> int:
    graphs = getattr(getattr(engine, "runner", None), "graphs", None)
    return len(graphs.graphs) if graphs is not None else 0


def _engine_figures(engine, graphs_before: int) -> dict:
    runner = engine.runner
    figures = {
        "stage_seconds": {k: round(v, 2) for k, v in sorted(engine.timer.seconds.items())},
        "gpu_sampling": engine.gpu_sampling,
        "stage_timers_synchronised": engine.timer.sync,
        "decode": "static" if runner.static else "upstream",
    }
    cache = getattr(runner, "cache", None)
    if runner.static and cache is not None:
        figures.update(
            kv_cache_mb=round((cache.k.numel() + cache.v.numel()) * cache.k.element_size() / 2**20),
            kv_positions_per_row=cache.capacity,
            graphs_captured=_graphs(engine),
            graphs_captured_while_timed=_graphs(engine) - graphs_before,
        )
    return figures


def _speak(backend, texts: list[str], speaker: str) -> int:
    if backend.engine is None:
        return sum(len(backend.synthesize(t, speaker, 1000 + i)) for i, t in enumerate(texts))
    total = 0
    for _, audio in backend.synthesize_many((i, t, speaker, 1000 + i) for i, t in enumerate(texts)):
        if isinstance(audio, BaseException):
            raise audio
        total += len(audio)
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", type=int, choices=(1, 2, 3), default=1)
    p.add_argument("--model-dir", help="a model directory (default: a random-weight model of --size, written once)")
    p.add_argument("--size", choices=("tiny", "full"), default="full")
    p.add_argument("--text", default=str(DEFAULT_TEXT))
    p.add_argument("--settings", default="today,static,graphs,gpu-sampler,bf16", help=f"any of {', '.join(SETTINGS)}")
    p.add_argument("--batch-sizes", default="32,64")
    p.add_argument(
        "--utterances", type=int, default=192, help="per measurement (the upstream setting speaks a sixteenth)"
    )
    p.add_argument("--max-words", type=int, default=10)
    p.add_argument("--set", action="append", default=[], help="a further config override for every measurement")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    unknown = [s for s in args.settings.split(",") if s not in SETTINGS]
    if unknown:
        p.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="convtts-bench-"))
    overrides = [
        f"tts.cosyvoice.model_dir={model_dir(args)}",
        f"text.max_words={args.max_words}",
        *prompt_overrides(args, work),
        *args.set,
    ]
    texts = segments(args.text, args.max_words, args.utterances)
    reports = []
    for setting in args.settings.split(","):
        for rows in [int(b) for b in args.batch_sizes.split(",")] if setting != "upstream" else [1]:
            reports.append(measure(args, setting, rows, texts, overrides))
            summary = {
                "version": args.version,
                "max_words": args.max_words,
                "seconds_so_far": round(time.perf_counter() - started),
                "reports": reports,
            }
            Path(args.out).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    print(f"{len(reports)} measurements in {time.perf_counter() - started:.0f} s; figures in {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
