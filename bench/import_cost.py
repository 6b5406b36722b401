#!/usr/bin/env python3
"""What a v1 worker imports before it speaks, and whether transformers is among it.

Imports torch, then the CosyVoice runtime as a v1 load does (transformers held back:
convtts.speak.cosyvoice.deferred), then the modules a v1 model's yaml names (the flow decoder brings
Matcha-TTS, diffusers and, where installed, lightning), in a fresh interpreter each time, and prints
the seconds of each step and, if transformers was imported after all, the stack that imported it.
Run it under `python3 -X importtime` for the full tree.

    python3 bench/import_cost.py [--version 1|none] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback

# the classes the v1 yaml (convtts.testing.cosyvoice_v1) names, by module
V1_MODULES = (
    "cosyvoice.llm.llm",
    "cosyvoice.flow.flow",
    "cosyvoice.flow.flow_matching",
    "cosyvoice.flow.decoder",
    "cosyvoice.flow.length_regulator",
    "cosyvoice.hifigan.generator",
    "cosyvoice.hifigan.f0_predictor",
    "cosyvoice.transformer.encoder",
    "whisper.tokenizer",
)
# what convtts.speak.cosyvoice.unused_imports keeps out of the import (the last two come with them)
KEPT_OUT = ("modelscope", "scipy.signal", "librosa.filters", "numba", "whisper.model", "scipy.io")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", default="1", help="1: a v1 load's imports; none: everything imported plainly")
    p.add_argument("--out")
    args = p.parse_args()
    version = None if args.version == "none" else int(args.version)
    importer: list[str] = []
    _watch_transformers(importer)

    from convtts.config import CosyVoiceConfig
    from convtts.speak.cosyvoice.deferred import transformers_deferred
    from convtts.speak.cosyvoice.runtime import import_runtime
    from convtts.speak.cosyvoice.unused_imports import kept_out

    seconds = {}
    started = time.time()
    import torch  # noqa: F401

    seconds["torch"] = round(time.time() - started, 2)
    step = time.time()
    import_runtime(CosyVoiceConfig(), version)
    seconds["runtime"] = round(time.time() - step, 2)
    step = time.time()
    with transformers_deferred(version == 1), kept_out():
        for name in V1_MODULES:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                print(f"{name}: {exc}", file=sys.stderr)
    seconds["model_modules"] = round(time.time() - step, 2)
    report = {
        "version": version,
        "seconds": seconds,
        "total": round(time.time() - started, 2),
        "transformers_imported": "transformers.utils" in sys.modules,
        "kept_out_imported": [name for name in KEPT_OUT if name in sys.modules],
        "imported_by": importer[:1],
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


def _watch_transformers(importer: list[str]) -> None:
    """Record the stack of the first real import of transformers."""
    import importlib.abc

    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            # transformers/__init__ imports its utils first: the library itself is loading
            if fullname == "transformers.utils" and not importer:
                frames = [f for f in traceback.format_stack()[:-1] if "importlib._bootstrap" not in f]
                importer.append("".join(frames[-16:]))
            return None

    sys.meta_path.insert(0, Watch())


if __name__ == "__main__":
    sys.exit(main())
