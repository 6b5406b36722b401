#!/usr/bin/env python3
"""What one decode step costs by its rows' lengths: the torch attention against the kernel (tts.cosyvoice.attention).

A static step reads the KV cache of its rows; the torch attention reads every row up to the step's
length bucket (the longest row), the kernel (engine/attention.py) each row's own positions. For
128 rows of the shipped model and precision, this times the step's CUDA graph replayed alone on the
GPU, for rows all of one length and for short rows beside a few long ones (what short-turn text
makes), with each attention, and compares the two steps' log-probabilities on the same cache.

    python3 bench/decode_step.py --model-dir /tmp/cv300m --out "$OUT/decode-step.json"
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ROWS = 128
# (name, [(rows, position of the new token)]): every row of a step, by length
MIXES = [
    ("all 128", [(ROWS, 127)]),
    ("all 512", [(ROWS, 511)]),
    ("all 1024", [(ROWS, 1023)]),
    ("all 2000", [(ROWS, 1999)]),
    ("1 at 2000, 127 at 100", [(1, 1999), (ROWS - 1, 99)]),
    ("8 at 1500, 120 at 150", [(8, 1499), (ROWS - 8, 149)]),
    ("32 at 600, 96 at 200", [(32, 599), (ROWS - 32, 199)]),
]


def runner_of(engine, attention: str):
    """A static runner like the engine's, with the given attention, its cache for ROWS rows of 2048 positions."""
    from convtts.speak.cosyvoice.engine.runner import DecodeOptions

    options = DecodeOptions(row_tokens=2048, attention=attention)
    runner = type(engine.runner)(engine.llm, engine.device, engine.precision.llm, options)
    runner.prepare(ROWS)
    return runner


def set_lengths(runner, mix) -> int:
    """Each row's position as the mix says; returns the step's length bucket."""
    import torch

    from convtts.cuda_graphs import length_bucket

    positions = [position for rows, position in mix for _ in range(rows)]
    runner.cache.lengths.copy_(torch.tensor(positions, device=runner.cache.lengths.device))
    return length_bucket(max(positions) + 1, runner.cache.capacity)


def timed_step(runner, mix, repeat: int) -> float:
    """Median seconds of one step's graph replayed (lengths put back before each)."""
    import torch

    times = []
    for _ in range(repeat + 1):
        length = set_lengths(runner, mix)
        torch.cuda.synchronize()
        started = time.perf_counter()
        runner.graphs.run(ROWS, length)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[len(times) // 2 - 1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", default="/tmp/cv300m")
    p.add_argument("--config", default=str(REPO / "configs" / "cosyvoice.yaml"))
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--out")
    args = p.parse_args()
    import torch

    from convtts.config import load_config
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    config = load_config(args.config, [f"tts.cosyvoice.model_dir={args.model_dir}", f"tts.cosyvoice.batch_size={ROWS}"])
    engine = CosyVoiceBackend(config).engine
    results = {"device": torch.cuda.get_device_name(), "precision": engine.precision.llm, "rows": ROWS, "mixes": []}
    with torch.inference_mode():
        runners = {name: runner_of(engine, name) for name in ("torch", "triton")}
        if not runners["triton"].kernel:
            print("the kernel does not run here (Triton missing?): nothing to compare", flush=True)
            return 1
        generator = torch.Generator(device=engine.device).manual_seed(0)
        for part in ("k", "v"):
            cache = getattr(runners["torch"].cache, part)
            cache.copy_(torch.randn(cache.shape, generator=generator, device=cache.device, dtype=cache.dtype))
            getattr(runners["triton"].cache, part).copy_(cache)
        tokens = torch.randint(0, 4000, (ROWS,), generator=generator, device=engine.device)
        for runner in runners.values():
            runner.cache.tokens.copy_(tokens)
        for name, mix in MIXES:
            row = {"mix": name}
            logps = {}
            for attention, runner in runners.items():
                length = set_lengths(runner, mix)
                runner.run_step(ROWS, length)  # eager once: the same state for both
                logps[attention] = runner.logps.clone()
                row[f"{attention}_ms"] = round(timed_step(runner, mix, args.repeat) * 1000, 3)
            row["speed_up"] = round(row["torch_ms"] / row["triton_ms"], 2)
            row["logp_max_diff"] = round(float((logps["torch"] - logps["triton"]).abs().max()), 5)
            print(orjson.dumps(row).decode(), flush=True)
            results["mixes"].append(row)
    if args.out:
        Path(args.out).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
