#!/usr/bin/env python3
"""Memory of one worker across model rebuilds: build, speak, release (as a worker does), repeat.

Prints resident memory (and torch's GPU figures where CUDA is there) after each build-and-speak
and after each release, so growth per rebuild shows directly.

    python bench/rebuild_memory.py --model-dir /tmp/cv300m --rebuilds 5
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def gpu_figures(torch) -> str:
    if not torch.cuda.is_available():
        return ""
    return (
        f", gpu allocated {torch.cuda.memory_allocated() / 2**20:.0f} MiB,"
        f" reserved {torch.cuda.memory_reserved() / 2**20:.0f} MiB"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--rebuilds", type=int, default=5)
    p.add_argument("--text", default="Hello there, how are you this morning?")
    args = p.parse_args()

    import torch

    from convtts.config import load_config
    from convtts.run.memory import rss_mb
    from convtts.run.worker_setup import release_backend
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    config = load_config(REPO / "configs" / "cosyvoice.yaml", [f"tts.cosyvoice.model_dir={args.model_dir}"])
    speaker = config.speakers.voices[0]
    for build in range(args.rebuilds):
        backend = CosyVoiceBackend(config)
        backend.synthesize(args.text, speaker, seed=1)
        print(f"build {build}: after speaking rss {rss_mb():.0f} MiB{gpu_figures(torch)}", flush=True)
        release_backend(backend)
        del backend
        print(f"build {build}: after release rss {rss_mb():.0f} MiB{gpu_figures(torch)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
