"""Writes a random-weight CosyVoice model directory (v1 SFT, v2 or v3) of the real architecture, offline.

For tests and GPU benchmarks without the released weights: the upstream runtime loads it like the
released model and speaks noise. The decode length can be pinned, so audio length is known:

    python -m convtts.testing.cosyvoice_model --out models/cv-tiny --size tiny --tokens-per-text-token 14
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from convtts.testing import cosyvoice_v1 as v1
from convtts.testing.cosyvoice_v1 import DEFAULT_TOKENS_PER_TEXT_TOKEN, SIZES, SPEAKERS

INFO_FILE = "convtts_model.json"


def model_info(model_dir: str | Path) -> dict:
    """What the generator recorded about a directory it wrote (size, speakers, decode pin)."""
    return json.loads((Path(model_dir) / INFO_FILE).read_text(encoding="utf-8"))


def build_model_dir(
    out: str | Path,
    size: str = "tiny",
    speakers: Iterable[str] = SPEAKERS,
    tokens_per_text_token: float | None = None,
    eos_bias: str | None = None,
    seed: int = 0,
    version: int = 1,
    runtime_root: str = "",
) -> Path:
    """Write the model directory and return its path; nothing is downloaded.

    Default decoding: exactly 14 speech tokens per text token for v1 (50 Hz), 7 for v2 and v3
    (25 Hz); see decode_settings. v3 needs a checkout of the official runtime (`runtime_root` or
    $COSYVOICE_ROOT): no installable package has its classes.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if version not in (1, 2, 3):
        raise ValueError(f"version must be 1, 2 or 3, got {version!r}")
    speakers = list(dict.fromkeys(speakers))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runtime = _import_runtime(runtime_root, version)
    if version == 1:
        pin, shift, exact = v1.decode_settings(tokens_per_text_token, eos_bias)
        built = v1.build_v1(out, size, speakers, pin, shift, seed)
    else:
        from convtts.testing import cosyvoice_qwen as qwen

        if eos_bias == "high":
            raise ValueError("eos_bias high is for v1 models; pin v2/v3 with tokens_per_text_token")
        if eos_bias is not None and tokens_per_text_token is not None:
            raise ValueError("give tokens_per_text_token or eos_bias, not both")
        pin = None if eos_bias else float(tokens_per_text_token or qwen.DEFAULT_TOKENS_PER_TEXT_TOKEN)
        built = qwen.build_qwen_model_dir(out, version, size, speakers, pin, seed, endless=eos_bias == "low")
        exact = v1.UPSTREAM_MAX_RATIO if eos_bias == "low" else pin
        shift = None
    info = {
        "generator": "convtts.testing.cosyvoice_model",
        "version": 1,
        "model_version": version,
        "size": size,
        "seed": seed,
        "speakers": speakers,
        "tokens_per_text_token": exact,
        "eos_bias": eos_bias,
        "eos_logit_shift": shift,
        "runtime": runtime,
        **built,
    }
    (out / INFO_FILE).write_text(json.dumps(info, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return out


def _import_runtime(runtime_root: str, version: int) -> str:
    """Import the runtime the yaml's classes come from (a checkout for v3); returns where it is."""
    from convtts.config import CosyVoiceConfig
    from convtts.speak.cosyvoice.runtime import _origin, import_runtime

    module = import_runtime(CosyVoiceConfig(runtime_root=runtime_root))
    if version == 3 and not hasattr(module, "CosyVoice3"):
        raise ValueError(
            f"the CosyVoice runtime at {_origin(module)} has no CosyVoice3: "
            "give --runtime-root (or $COSYVOICE_ROOT) a checkout of the official repository"
        )
    return _origin(sys.modules["cosyvoice"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m convtts.testing.cosyvoice_model",
        description=__doc__.split("\n\n")[0],
        epilog="Audio length with a pin of N, per text chunk of T tokens: v1 int(int(T*N) / 50 * 22050 / 256) * 256 "
        "samples at 22050 Hz; v2 and v3 int(T*N) * 960 samples at 24000 Hz.",
    )
    parser.add_argument("--out", required=True, help="directory to write (created; files overwritten)")
    parser.add_argument(
        "--version",
        type=int,
        choices=(1, 2, 3),
        default=1,
        help="1: CosyVoice-300M-SFT layout; 2: CosyVoice2-0.5B; 3: Fun-CosyVoice3-0.5B (needs a checkout)",
    )
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="tiny",
        help="tiny: a few channels, 1 block, loads in seconds; full: the released shapes",
    )
    parser.add_argument(
        "--speakers",
        default=None,
        help="comma-separated names for spk2info.pt (default: the SFT names for v1, none for v2/v3)",
    )
    parser.add_argument(
        "--runtime-root", default="", help="a CosyVoice checkout (default $COSYVOICE_ROOT, else the installed package)"
    )
    decode = parser.add_mutually_exclusive_group()
    decode.add_argument(
        "--tokens-per-text-token",
        type=float,
        default=None,
        metavar="N",
        help=f"exactly N speech tokens per text token (default {DEFAULT_TOKENS_PER_TEXT_TOKEN} for v1, 7 for v2/v3)",
    )
    decode.add_argument(
        "--eos-bias",
        choices=("high", "low", "none"),
        default=None,
        help="upstream's bounds instead: high stops at the minimum (2 per text token, v1 only), "
        "low never draws an end token and runs to the maximum (20), none lets the random model stop where it does",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and embeddings")
    args = parser.parse_args(argv)
    if args.tokens_per_text_token is not None and args.tokens_per_text_token <= 0:
        parser.error("--tokens-per-text-token must be positive")
    if args.speakers is None:
        speakers = list(SPEAKERS) if args.version == 1 else []
    else:
        speakers = [s.strip() for s in args.speakers.split(",") if s.strip()]
    if args.version == 1 and not speakers:
        parser.error("--speakers names no speaker")
    try:
        out = build_model_dir(
            args.out,
            args.size,
            speakers,
            args.tokens_per_text_token,
            args.eos_bias,
            args.seed,
            args.version,
            args.runtime_root,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(model_info(out), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
