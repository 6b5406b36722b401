#!/usr/bin/env python3
"""The hf-whisper recogniser alone: time per take with takes packed into 30 s windows and without.

Loads a random Whisper (convtts.testing.whisper_model writes one into --model when it is not there),
makes N takes of D seconds of noise, and times one transcribe_many call over all of them, as the
gate makes it, split into log-mel features, encoder and decoding, for pack on and off at each
asr_batch (windows a batch). A random decoder never says end-of-text, so every window decodes to
its bound (7 tokens a second + 10 a take): an upper bound on the decoding's share. Each setting runs
once untimed first (allocation, kernel choice), then --repeat times; the figures are the fastest.

    python bench/whisper_cost.py --size tiny --takes 48 --repeat 1               # a CPU dry run
    python bench/whisper_cost.py --size turbo --model models/whisper-turbo --out bench/results/whisper-cost.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from convtts.config import load_config
from convtts.gate.whisper import RATE, TransformersWhisper, pack_takes
from convtts.testing.whisper_model import INFO_FILE, build_whisper_dir
from figures import report

PHASES = ("features", "encoder", "decode")


class TimedWhisper(TransformersWhisper):
    """The recogniser, each phase timed (the GPU synchronised around it, so its time is its own)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.clock = dict.fromkeys(PHASES, 0.0)
        self.steps = 0

    def _timed(self, phase: str, work, *args):
        self._sync()
        started = time.perf_counter()
        out = work(*args)
        self._sync()
        self.clock[phase] += time.perf_counter() - started
        return out

    def _sync(self) -> None:
        if self.device != "cpu":
            import torch

            torch.cuda.synchronize()

    def _features(self, audio):
        return self._timed("features", super()._features, audio)

    def _encode(self, features):
        return self._timed("encoder", super()._encode, features)

    def _decode(self, encoded, limits):
        tokens = self._timed("decode", super()._decode, encoded, limits)
        self.steps += max(len(row) for row in tokens) if tokens else 0
        return tokens


def model_dir(path: Path, size: str) -> Path:
    if not (path / INFO_FILE).is_file():
        print(f"writing a random {size} Whisper to {path}", file=sys.stderr)
        build_whisper_dir(path, size)
    return path


def noise_takes(count: int, seconds: float) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(int(RATE * seconds)) * 0.1).astype(np.float32) for _ in range(count)]


def measure(recogniser: TimedWhisper, takes: list, pack: bool, repeat: int) -> dict:
    recogniser.transcribe_many(takes, pack=pack)  # untimed: the first call allocates and picks kernels
    best = None
    for _ in range(repeat):
        recogniser.clock, recogniser.steps = dict.fromkeys(PHASES, 0.0), 0
        started = time.perf_counter()
        recogniser.transcribe_many(takes, pack=pack)
        run = {**recogniser.clock, "total": time.perf_counter() - started, "decode_steps": recogniser.steps}
        best = run if best is None or run["total"] < best["total"] else best
    windows = len(pack_takes([len(t) for t in takes])) if pack else len(takes)
    per_take = {f"{k}_ms_per_take": round(1000 * best[k] / len(takes), 2) for k in (*PHASES, "total")}
    return {
        "pack": pack,
        "asr_batch": recogniser.batch,
        "takes": len(takes),
        "windows": windows,
        "encoder_batches": -(-windows // recogniser.batch),
        "decode_steps": best["decode_steps"],
        **{f"{k}_s": round(best[k], 4) for k in (*PHASES, "total")},
        **per_take,
    }


def table(rows: list[dict]) -> str:
    head = (
        "graphs",
        "pack",
        "asr_batch",
        "takes",
        "windows",
        "steps",
        "features s",
        "encoder s",
        "decode s",
        "total s",
        "ms/take",
    )
    lines = ["  ".join(f"{h:>10}" for h in head)]
    for r in rows:
        cells = (
            "on" if r["graphs"] else "off",
            "on" if r["pack"] else "off",
            r["asr_batch"],
            r["takes"],
            r["windows"],
            r["decode_steps"],
            r["features_s"],
            r["encoder_s"],
            r["decode_s"],
            r["total_s"],
            r["total_ms_per_take"],
        )
        lines.append("  ".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=("tiny", "turbo"), default="tiny", help="the random Whisper's shapes")
    p.add_argument(
        "--model", type=Path, help="checkpoint directory (written when missing; default models/whisper-SIZE)"
    )
    p.add_argument("--takes", type=int, default=160, help="takes in the one call (N)")
    p.add_argument("--seconds", type=float, default=2.5, help="each take's length (D)")
    p.add_argument("--batches", default="4,16,32", help="asr_batch values, windows a batch")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument(
        "--graphs", default="false,true", help="validate.asr_graphs values: the static decoder (graphs on CUDA) or not"
    )
    p.add_argument("--packs", default="false,true", help="validate.asr_pack values")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args()
    path = model_dir(args.model or REPO / "models" / f"whisper-{args.size}", args.size)
    takes = noise_takes(args.takes, args.seconds)
    rows, device = [], None
    for batch, graphs in itertools.product((int(b) for b in args.batches.split(",")), args.graphs.split(",")):
        cfg = load_config(
            None,
            [
                "validate.enabled=true",
                "validate.recogniser=hf-whisper",
                f"validate.model_path={path}",
                f"validate.asr_batch={batch}",
                f"validate.asr_device={args.device}",
                f"validate.asr_precision={args.precision}",
                f"validate.asr_graphs={graphs}",
            ],
        ).validate
        recogniser = TimedWhisper(cfg)
        device = f"{recogniser.device} {str(recogniser.dtype).removeprefix('torch.')}"
        for pack in (value == "true" for value in args.packs.split(",")):
            row = {"graphs": graphs == "true", **measure(recogniser, takes, pack, args.repeat)}
            if recogniser.static is not None:  # what ran: graphs captured, or eager steps after a failed capture
                steps = recogniser.static.graphs
                row.update(
                    graphs_captured=len(steps.graphs), graphs_failed=recogniser.device != "cpu" and not steps.capture
                )
            rows.append(row)
        del recogniser
    print(table(rows), file=sys.stderr)
    report(
        {
            "model": str(path),
            "size": args.size,
            "device": device,
            "takes": args.takes,
            "seconds": args.seconds,
            "repeat": args.repeat,
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
