#!/usr/bin/env python3
"""The batched engine's flow and vocoder alone: audio seconds per second of each part and deviation from eager fp32.

For one model (v1, v2 or v3; one runtime per process), decoded rows of chosen lengths (random
speech tokens; v2/v3 with a zero-shot prompt) go through the engine's flow passes and vocoder
under each setting. Flow settings (precision x graphs, and torch.compile when asked) are timed
with the vocoder left at upstream's per-row fp32 call; vocoder settings (precision x rows per pass)
with the flow at eager fp32; so each figure is one part's. For every setting: the part's audio
seconds per second (median of the timed repeats, after warm-up passes that capture the graphs),
its peak GPU MiB per pass next to pass_memory.py's estimate, and the largest sample difference of the
audio from each row rendered alone in eager fp32 (full-scale units; lengths must match exactly).

    python bench/flow_vocoder.py --version 1 --model-dir /tmp/cv-v1 --rows 32 --seconds 2:6 --out v1.json
    python bench/flow_vocoder.py --version 3 --model-dir /tmp/cv-v3-tiny --runtime-root $COSYVOICE_ROOT \
        --rows 4 --seconds 0.3:1 --repeat 1 --out v3.json                   # a CPU check with a tiny model

Results go to stdout as each setting finishes and to --out (rewritten after each setting).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from figures import report

FLOW_PRECISIONS = "fp32,tf32,bf16,fp16"
VOCODER_SETTINGS = "fp32:1,fp32:16,tf32:16,bf16:16,fp16:16"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", type=int, choices=(1, 2, 3), required=True)
    p.add_argument("--model-dir", required=True, help="a model directory (python -m convtts.testing.cosyvoice_model)")
    p.add_argument(
        "--runtime-root", default="", help="a CosyVoice checkout (v3 needs one); default: the installed package"
    )
    p.add_argument("--rows", type=int, default=32, help="decoded rows handed to the flow at once")
    p.add_argument("--seconds", default="2:6", help="shortest:longest row, in seconds of audio (spread evenly)")
    p.add_argument("--prompt-seconds", type=float, default=3.0, help="v2/v3: the zero-shot prompt's length")
    p.add_argument("--flow", default=FLOW_PRECISIONS, help="flow precisions to time")
    p.add_argument("--graphs", default="off,on", help="CUDA graphs for the flow: off, on or both")
    p.add_argument("--compile", action="store_true", help="also time torch.compile of the estimator (with graphs on)")
    p.add_argument(
        "--bucket",
        action="store_true",
        help="pad flow passes to the graphs' buckets even without a GPU, through the graphs' path (CPU checks)",
    )
    p.add_argument("--vocoder", default=VOCODER_SETTINGS, help="precision:rows per pass, for the vocoder")
    p.add_argument("--max-mb", type=int, default=4096, help="tts.cosyvoice.flow.max_mb for every setting")
    p.add_argument("--repeat", type=int, default=3, help="timed repeats per setting (after two warm-up runs on a GPU)")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def settings(args):
    """(part, Setting) for every flow and vocoder setting asked for."""
    import torch

    from convtts.testing.flow_vocoder import Setting

    cpu_graphs = args.bucket and not torch.cuda.is_available()  # the graphs' path, each step re-run (CPU checks)
    out = []
    for graphs in args.graphs.split(","):
        for precision in args.flow.split(","):
            on = graphs == "on"
            out.append(
                (
                    "flow",
                    Setting(
                        f"flow-{precision}-graphs-{graphs}",
                        flow=precision,
                        graphs=on,
                        vocoder_rows=1,
                        max_mb=args.max_mb,
                        bucket=True if on and args.bucket else None,
                        graph_stand_in=on and cpu_graphs,
                    ),
                )
            )
    if args.compile:
        for precision in args.flow.split(","):
            out.append(
                (
                    "flow",
                    Setting(
                        f"flow-{precision}-compile",
                        flow=precision,
                        graphs=True,
                        compile=True,
                        vocoder_rows=1,
                        max_mb=args.max_mb,
                    ),
                )
            )
    for item in args.vocoder.split(","):
        precision, rows = item.split(":")
        out.append(
            (
                "vocoder",
                Setting(
                    f"vocoder-{precision}-rows-{rows}", vocoder=precision, vocoder_rows=int(rows), max_mb=args.max_mb
                ),
            )
        )
    return out


def measure(model, chunk, tokens, part: str, setting, ref, repeat: int, rate: int, mels) -> dict:
    """One setting: warm-up runs (the second captures the flow's graphs), then `repeat` timed runs of
    the part alone; the audio of the last run (the other part as the reference renders it) is
    compared with each row alone. `mels`: the eager fp32 flow's mels and the rows' random streams after it."""
    import torch

    from convtts.speak.cosyvoice.engine.vocoder import Vocoder
    from convtts.testing.flow_vocoder import audio_seconds, build, deviation, flow_mels, make_rows, vocode

    flow, vocoder = build(model, setting)  # kept across the runs: the timed ones replay the graphs
    device = model.model.device
    warm = 2 if torch.cuda.is_available() else 0
    if part == "flow":
        runs = []
        for _ in range(warm + repeat):
            rows = make_rows(chunk, tokens)
            runs.append(flow_mels(flow, rows, device))
        runs = runs[warm:]
        # the last run's rows: v1 draws the vocoder's phases from the stream the flow's noise came from
        audio = vocode(Vocoder(model.model.hift, "fp32", 1), rows, runs[-1].mels, device).audio
        seconds, peaks = [r.flow_seconds for r in runs], [r.flow_peak_mb for r in runs]
    else:
        reference_mels, states = mels
        runs = [
            vocode(vocoder, after_flow(chunk, tokens, states), reference_mels, device) for _ in range(warm + repeat)
        ][warm:]
        audio = runs[-1].audio
        seconds, peaks = [r.vocoder_seconds for r in runs], [r.vocoder_peak_mb for r in runs]
    figures = {
        "setting": setting.name,
        "part": part,
        "flow_passes": [len(g) for g in flow.groups(make_rows(chunk, tokens))],
        "vocoder_passes": vocoder.last_passes,
        "graphs_held": len(flow.solver.graphs.graphs),
        "graph_replays": flow.solver.graphs.replays,
        "audio_seconds": round(audio_seconds(audio, rate), 2),
        "part_seconds": round(statistics.median(seconds), 4),
        "audio_seconds_per_second": round(audio_seconds(audio, rate) / max(statistics.median(seconds), 1e-9), 2),
        "deviation_full_scale": deviation(audio, ref),
        "lengths_match": all(len(a) == len(r) for a, r in zip(audio, ref)),
        "peak_mb_per_pass": round(max(peaks), 1),
    }
    del flow, vocoder
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return figures


def after_flow(chunk, tokens, states) -> list:
    """Fresh rows whose random streams are where the flow left them (v1's flow draws its noise there)."""
    from convtts.testing.flow_vocoder import make_rows

    rows = make_rows(chunk, tokens)
    for row, state in zip(rows, states):
        row.request.generator.set_state(state)
    return rows


def estimates(model, args, tokens) -> dict:
    """pass_memory.py's figures for the largest pass of these rows, to set next to the measured peaks."""
    from convtts.speak.cosyvoice.engine.pass_memory import flow_mb_per_row, vocoder_mb_per_row

    longest = float(args.seconds.split(":")[1])
    prompt = args.prompt_seconds if args.version > 1 else 0.0
    return {
        precision: {
            "flow_mb_per_row": round(flow_mb_per_row(args.version, precision, longest, prompt), 1),
            "vocoder_mb_per_row": round(vocoder_mb_per_row(args.version, precision, longest), 1),
        }
        for precision in ("fp32", "bf16")
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch

    from convtts.config import CosyVoiceConfig
    from convtts.speak.cosyvoice.runtime import import_runtime, load_model
    from convtts.testing.flow_vocoder import Setting, build, flow_inputs, flow_mels, make_rows, reference, token_lists

    cosy = CosyVoiceConfig(model_dir=args.model_dir, runtime_root=args.runtime_root)
    import_runtime(cosy)
    model = load_model(cosy)
    low, high = (float(x) for x in args.seconds.split(":"))
    chunk = flow_inputs(model, args.prompt_seconds)
    tokens = token_lists(model, list(np.linspace(low, high, args.rows)))
    rate = int(model.sample_rate)
    results = {
        "version": args.version,
        "rows": args.rows,
        "seconds": args.seconds,
        "prompt_seconds": args.prompt_seconds,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "estimates": estimates(model, args, tokens),
        "settings": [],
    }
    ref = reference(model, chunk, tokens)
    eager = build(model, Setting("eager-fp32"))[0]  # the vocoder settings' input: mels as the reference flow makes them
    rows = make_rows(chunk, tokens)
    mels = flow_mels(eager, rows, model.model.device).mels, [row.request.generator.get_state() for row in rows]
    for part, setting in settings(args):
        try:
            figures = measure(model, chunk, tokens, part, setting, ref, args.repeat, rate, mels)
        except Exception as exc:  # one setting failing (a capture, a compile) leaves the others' figures
            figures = {"setting": setting.name, "part": part, "error": f"{type(exc).__name__}: {exc}"}
        results["settings"].append(figures)
        print(orjson.dumps(figures).decode(), flush=True)
        Path(args.out).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    report(results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
