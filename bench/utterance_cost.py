#!/usr/bin/env python3
"""Where a worker's CPU time goes per utterance with the silence backend: each step of utterance.py
timed alone, in one process, on segments of the repository's sample text.

    python bench/utterance_cost.py --utterances 2000
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from convtts.config import load_config
from convtts.plan.textclean import clean, split_segments
from convtts.run.utterance import Context, Settings, check_audio, manifest_row, write_audio
from convtts.speak.silence import SilenceBackend
from convtts.state.layout import Layout
from convtts.state.shardio import append_line, audio_problem
from figures import report
from sample_text import DEFAULT_TEXT, read_conversations


def segments(count: int) -> list[dict]:
    texts = []
    for record in read_conversations(DEFAULT_TEXT):
        for turn in record["conversations"]:
            text, reason = clean(turn["value"])
            texts += split_segments(text, 30) if reason is None else []
    return [{"id": f"c{i}-000-00", "text": texts[i % len(texts)], "speaker": "joe"} for i in range(count)]


def encoding(audio, rate: int) -> float:
    """The first half of utterance.write_audio alone: clipping and encoding in memory (the rest is the write)."""
    started = time.process_time()
    sf.write(io.BytesIO(), np.clip(audio, -1.0, 1.0), rate, subtype="PCM_16", format="WAV")
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--utterances", type=int, default=2000)
    parser.add_argument("--workdir", default="/tmp")
    parser.add_argument("--out")
    args = parser.parse_args()
    config = load_config(None, ["tts.backend=silence"])
    backend = SilenceBackend(config)
    root = Path(tempfile.mkdtemp(prefix="convtts-utt-", dir=args.workdir))
    layout = Layout(root)
    layout.audio_dir("shard-00000").mkdir(parents=True)
    layout.work_dir.mkdir()
    ctx = Context(backend, None, layout, Settings.of(config, "bench"))
    steps = dict.fromkeys(
        (
            "synthesize",
            "check_audio",
            "encode_and_write",
            "manifest_row",
            "append_line",
            "merge_audio_check",
            "of_which_encoding",
        ),
        0.0,
    )
    items = segments(args.utterances)
    try:
        for segment in items:
            t0 = time.process_time()
            audio = backend.synthesize(segment["text"], segment["speaker"], 1)
            t1 = time.process_time()
            check_audio(audio)
            t2 = time.process_time()
            rel = write_audio(layout, "shard-00000", segment["id"], audio, backend.sample_rate, config.output)
            t3 = time.process_time()
            row = manifest_row(ctx, segment, rel, audio, 1, 1, t3 - t0)
            t4 = time.process_time()
            append_line(layout.manifest("shard-00000", "w0"), row)
            t5 = time.process_time()
            assert audio_problem(layout, row) is None
            t6 = time.process_time()
            encode = encoding(audio, backend.sample_rate)
            for name, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, encode)):
                steps[name] += seconds
        audio_bytes = sum(p.stat().st_size for p in layout.audio_dir("shard-00000").iterdir())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = len(items)
    result = {
        "utterances": n,
        "sample_rate": backend.sample_rate,
        "mean_audio_kb": round(audio_bytes / n / 1024, 1),
        "cpu_ms_per_utterance": {k: round(v / n * 1000, 4) for k, v in steps.items()},
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    report(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
