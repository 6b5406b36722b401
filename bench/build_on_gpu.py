#!/usr/bin/env python3
"""A v1 model built on the GPU against one built on the CPU (as upstream does): the same weights, the same
tables, the same audio, and where each load's time goes.

Loads the model three times in one process, as a worker does (CosyVoiceBackend): built on the GPU,
on the CPU, on the GPU again; speaks the same segments with the same seeds after each; and writes
the load phases, a checksum of every parameter and buffer, the largest difference of the tensors
computed at construction (positional tables), and how each take compares with the first build's
(the third build says how far two loads of the same kind agree). Needs a GPU.

    python bench/build_on_gpu.py --out build.json                  # a full-size random CosyVoice-300M-SFT
    python bench/build_on_gpu.py --model-dir DIR --utterances 48 --out build.json
    python bench/build_on_gpu.py --size tiny --utterances 4 --out /tmp/b.json   # a dry run on the CPU, both built there
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batch_engine import REPO, model_dir, segments
from sample_text import DEFAULT_TEXT

sys.path.insert(0, str(REPO))


def tensors_of(model) -> dict[str, object]:
    """Every tensor the model's modules hold: parameters, buffers, and plain tensor attributes."""
    import torch

    found = {}
    for part in ("llm", "flow", "hift"):
        for name, module in getattr(model.model, part).named_modules():
            for attr, value in vars(module).items():
                if isinstance(value, torch.Tensor):
                    found[f"{part}.{name}.{attr}"] = value
            for attr, value in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
                found[f"{part}.{name}.{attr}"] = value
    return found


def build(texts: list[str], speaker_seed: int, on_gpu: bool, cosy_dir: str) -> dict:
    import torch

    import convtts.speak.cosyvoice.backend as backend_module
    from convtts.config import load_config

    real = backend_module.load_model
    if not on_gpu:
        backend_module.load_model = lambda cosy, clock=None, device=None: real(cosy, clock, None)
    try:
        config = load_config(REPO / "configs" / "cosyvoice.yaml", [f"tts.cosyvoice.model_dir={cosy_dir}"])
        started = time.perf_counter()
        backend = backend_module.CosyVoiceBackend(config)
        load = time.perf_counter() - started
    finally:
        backend_module.load_model = real
    speaker = config.speakers.voices[0]
    items = ((i, text, speaker, speaker_seed + i) for i, text in enumerate(texts))
    audio = {key: np.asarray(take) for key, take in backend.synthesize_many(items)}
    held = tensors_of(backend.model)
    tensors = {name: t.detach().float().cpu() for name, t in held.items()}
    devices = sorted({str(t.device) for t in held.values()})
    phases = dict(backend.load_phases)
    del backend, held
    gc.collect()
    torch.cuda.empty_cache()
    return {"load_s": round(load, 3), "phases": phases, "devices": devices, "audio": audio, "tensors": tensors}


def compare(first: dict, other: dict) -> dict:
    names = sorted(set(first["tensors"]) | set(other["tensors"]))
    missing = [n for n in names if n not in first["tensors"] or n not in other["tensors"]]
    shapes = [n for n in names if n not in missing and first["tensors"][n].shape != other["tensors"][n].shape]
    diffs = {
        n: float((first["tensors"][n] - other["tensors"][n]).abs().max()) if first["tensors"][n].numel() else 0.0
        for n in names
        if n not in missing and n not in shapes
    }
    differing = {n: d for n, d in diffs.items() if d > 0}
    takes = []
    for key, audio in first["audio"].items():
        again = other["audio"].get(key)
        same_length = again is not None and again.shape == audio.shape
        diff = float(np.abs(audio - again).max()) if same_length else None
        takes.append({"key": key, "samples": [len(audio), None if again is None else len(again)], "max_abs": diff})
    return {
        "tensors": len(names),
        "missing": missing,
        "shapes_differ": shapes,
        "tensors_differing": len(differing),
        "largest_differences": sorted(differing.items(), key=lambda kv: -kv[1])[:10],
        "takes_identical": sum(t["max_abs"] == 0.0 for t in takes),
        "takes_same_length": sum(t["max_abs"] is not None for t in takes),
        "takes": len(takes),
        "largest_take_difference": max((t["max_abs"] for t in takes if t["max_abs"] is not None), default=None),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="")
    p.add_argument("--size", default="full", help="of the random-weight model made when --model-dir is not given")
    p.add_argument("--utterances", type=int, default=32)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.version = 1
    cosy_dir = model_dir(args)
    texts = segments(str(DEFAULT_TEXT), 30, args.utterances)
    runs = {}
    for label, on_gpu in (("gpu", True), ("cpu", False), ("gpu_again", True)):
        runs[label] = build(texts, 1000, on_gpu, cosy_dir)
        print(label, runs[label]["load_s"], runs[label]["phases"], runs[label]["devices"], flush=True)
    report = {
        "model_dir": cosy_dir,
        "loads": {label: {k: run[k] for k in ("load_s", "phases", "devices")} for label, run in runs.items()},
        "gpu_vs_cpu": compare(runs["gpu"], runs["cpu"]),
        "gpu_vs_gpu_again": compare(runs["gpu"], runs["gpu_again"]),
    }
    Path(args.out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    for key in ("gpu_vs_cpu", "gpu_vs_gpu_again"):
        print(key, {k: v for k, v in report[key].items() if k != "largest_differences"})
        print("  largest tensor differences:", report[key]["largest_differences"][:5])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
