#!/usr/bin/env python3
"""Write a voice pool for benchmarks: N prompt recordings of quiet noise, 3 to 8 s long, and a JSON-lines manifest.

For a random-weight model only a prompt's length matters (its speech tokens are prefilled, its mel
frames condition the flow), not what it says; the lengths are spread so that voices cost differently,
as real recordings do. Also writes the first K voices as a pool of their own, for comparison.

    python bench/make_pool.py --out /tmp/pool --voices 500 --also 2 [--version 3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import orjson
import soundfile as sf

TEXT = "This is a short prompt for a new voice, about ten words."
V3_HEAD = "You are a helpful assistant.<|endofprompt|>"  # CosyVoice3 asks for it in every prompt


def write_pool(out: Path, voices: int, rate: int, head: str) -> list[dict]:
    (out / "audio").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lines = []
    for n in range(voices):
        seconds = 3 + 5 * (n * 0.618034 % 1)  # spread evenly over 3 to 8 s
        sf.write(
            out / "audio" / f"v{n:05d}.wav", (rng.standard_normal(int(rate * seconds)) * 0.05).astype("float32"), rate
        )
        lines.append({"name": f"voice-{n:05d}", "audio": f"audio/v{n:05d}.wav", "text": head + TEXT})
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--voices", type=int, default=500)
    p.add_argument("--also", type=int, default=2, help="write pool-K.jsonl with the first K voices too (0: not)")
    p.add_argument("--rate", type=int, default=24000)
    p.add_argument("--version", type=int, default=2, help="3: transcripts with CosyVoice3's instruction and marker")
    args = p.parse_args()
    lines = write_pool(args.out, args.voices, args.rate, V3_HEAD if args.version == 3 else "")
    for count in filter(None, (args.voices, args.also)):
        path = args.out / f"pool-{count}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines[:count]))
        print(path)


if __name__ == "__main__":
    main()
