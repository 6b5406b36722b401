#!/usr/bin/env python3
"""CPU cost of the quality gate per audio second: the checks and the pocketsphinx round trip, in CPU time.

Speaks the first N segments of the sample text with the default Piper voice (not timed), then
scores each with the gate (validate on, default thresholds) and reports CPU seconds of the gate per
second of audio, from this process's CPU time (the gate is single-threaded), so that other load on
the machine changes it less than wall time would. Cores the gate needs at a throughput of R audio
seconds per second: R times that figure.

    python bench/asr_cost.py --segments 60 --out bench/results/asr-cost.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from figures import report
from sample_text import DEFAULT_TEXT, read_conversations  # bench/ is this script's own folder on sys.path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from convtts.config import load_config
from convtts.gate.quality import QualityFailure, open_gate
from convtts.plan.planner import plan_conversation
from convtts.speak.piper import PiperBackend


def segments(count: int, config) -> list[dict]:
    out = []
    for number, record in enumerate(read_conversations(DEFAULT_TEXT)):
        out += plan_conversation(str(number), record, config)[0]
        if len(out) >= count:
            return out[:count]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--segments", type=int, default=60)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    config = load_config(None, ["validate.enabled=true"])
    voice = PiperBackend(config)
    takes = [(s["text"], voice.synthesize(s["text"], s["speaker"], 0)) for s in segments(args.segments, config)]
    started = time.process_time()
    gate = open_gate(config.validate)
    load_cpu = time.process_time() - started
    cpu, wers, refused = [], [], []
    for text, audio in takes:
        started = time.process_time()
        try:
            scores = gate.judge(audio, voice.sample_rate, text)
        except QualityFailure as bad:
            scores = bad.scores
            refused.append(str(bad))
        cpu.append(time.process_time() - started)
        if scores.get("wer") is not None:
            wers.append(scores["wer"])
    audio_seconds = sum(len(a) for _, a in takes) / voice.sample_rate
    result = {
        "segments": len(takes),
        "audio_seconds": round(audio_seconds, 2),
        "cores_here": os.cpu_count(),
        "recogniser_load_cpu_seconds": round(load_cpu, 3),
        "gate_cpu_seconds_per_audio_second": round(sum(cpu) / audio_seconds, 4),
        "gate_cpu_seconds_per_utterance": round(float(np.mean(cpu)), 4),
        "wer_mean": round(float(np.mean(wers)), 4) if wers else None,
        "wer_scored": len(wers),
        "refused": refused,
        "cores_needed_at_60_audio_s_per_s": round(60 * sum(cpu) / audio_seconds, 1),
    }
    report(result, args.out)


if __name__ == "__main__":
    main()
