#!/usr/bin/env python3
"""The flow beside the decode against the flow in the decode's thread, in one worker: the same audio, and how fast.

Loads the model twice (tts.cosyvoice.flow.overlap=never, then always; every other setting from
configs/cosyvoice.yaml, the parts in bf16), speaks the same segments (cleaned and split as the
planner does, longest first as a slot hands them out) with each, and prints per setting the audio
seconds per second, the engine's own line (where its time went) and, between the two, the largest
difference of any utterance's samples and the utterances whose lengths differ.

    python3 bench/overlap_check.py --model-dir /tmp/cv300m --utterances 600 --rows 64 --out overlap.json
    python3 bench/overlap_check.py --size tiny --utterances 12 --rows 4 --out /tmp/o.json   # a dry run on CPU
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import orjson

from batch_engine import model_dir, segments  # bench/ is on sys.path
from sample_text import DEFAULT_TEXT

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BF16 = [f"tts.cosyvoice.precision.{part}=bf16" for part in ("llm", "flow", "vocoder")]


class EngineLines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        if record.getMessage().startswith("engine: "):
            self.lines.append(record.getMessage())


def speak(args, overlap: str, texts: list[str]) -> tuple[dict, dict]:
    from convtts.config import load_config
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    overrides = [f"tts.cosyvoice.model_dir={args.model_dir}", f"tts.cosyvoice.batch_size={args.rows}"]
    config = load_config(REPO / "configs" / "cosyvoice.yaml", overrides + BF16 + [f"tts.cosyvoice.flow.overlap={overlap}"])
    backend = CosyVoiceBackend(config)
    speaker = config.speakers.voices[0]
    warm = [(i, t, speaker, 1000 + i) for i, t in enumerate(texts[: args.rows])]
    for _ in backend.synthesize_many(warm):  # kernels chosen, graphs captured
        pass
    lines = EngineLines()
    logging.getLogger("convtts.speak.cosyvoice.engine.engine").addHandler(lines)
    started = time.perf_counter()
    audio = dict(backend.synthesize_many((i, t, speaker, 1000 + i) for i, t in enumerate(texts)))
    wall = time.perf_counter() - started
    logging.getLogger("convtts.speak.cosyvoice.engine.engine").removeHandler(lines)
    seconds = sum(len(a) for a in audio.values() if not isinstance(a, BaseException)) / backend.sample_rate
    report = {
        "overlap": overlap,
        "overlapping": backend.engine.renderer.overlap,
        "utterances": len(texts),
        "failed": sum(isinstance(a, BaseException) for a in audio.values()),
        "audio_seconds": round(seconds, 1),
        "wall_seconds": round(wall, 2),
        "audio_seconds_per_second": round(seconds / wall, 2),
        "engine": lines.lines,
    }
    backend.close()
    print(orjson.dumps(report).decode(), flush=True)
    return report, audio


def compare(a: dict, b: dict) -> dict:
    lengths = [k for k in a if len(a[k]) != len(b[k])]
    same = [k for k in a if k not in lengths]
    diff = max((float(np.abs(a[k] - b[k]).max()) for k in same), default=0.0)
    return {"max_abs_difference": diff, "lengths_differ": len(lengths), "compared": len(same)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", help="a v1 model directory (default: a random-weight one of --size)")
    p.add_argument("--size", choices=("tiny", "full"), default="full")
    p.add_argument("--utterances", type=int, default=600)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--max-words", type=int, default=30)
    p.add_argument("--text", default=str(DEFAULT_TEXT))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.version = 1
    args.model_dir = model_dir(args)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("convtts.speak.cosyvoice.engine.engine").setLevel(logging.INFO)
    texts = sorted(segments(args.text, args.max_words, args.utterances), key=len, reverse=True)
    off, off_audio = speak(args, "never", texts)
    on, on_audio = speak(args, "always", texts)
    result = {"off": off, "on": on, "difference": compare(off_audio, on_audio)}
    print(orjson.dumps(result["difference"]).decode())
    Path(args.out).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
