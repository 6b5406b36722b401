#!/usr/bin/env python3
"""What one flow pass and one vocoder pass cost, by rows and length: eager, captured, replayed; one row alone.

The engine renders decoded rows in passes (flow.py groups them, vocoder.py again), so the cost of
a pass apart from its size decides how short rows fare: a job of rows of one second makes many
more passes per audio second than one of ten-second rows when passes cannot take many rows. For
each (rows, seconds of audio a row) this times, in one process with the GPU to itself and the
shipped precision (bf16): the flow's pass run eagerly (after a warm-up pass), the pass that captures
the graph of its step, and the median of a few that replay it; then the vocoder for the same rows in
one pass, and each row alone (upstream's call, what a pass of one row runs). Times include the GPU's
work (synchronised).

    python3 bench/pass_cost.py --model-dir /tmp/cv300m --out "$OUT/pass-cost.json"
    python3 bench/pass_cost.py --model-dir /tmp/tiny --rows 1,2 --seconds 0.5 --out /tmp/p.json   # CPU check

The figures end with a profile for the engine's table of GPU kinds (speak/cosyvoice/engine/profiles.py):
each pass's own price and its price a padded row-frame, fitted to the passes measured.

`--attention` is tts.cosyvoice.flow.attention: auto (shipped) runs the flow's attention as the kernel
over each row's own frames where Triton runs, torch as torch's attention over the padded width; each
pass's figures say which ran (`kernel`).

With --profile, the GPU's kernels of one eager flow pass and one vocoder pass are listed too (torch.profiler;
a replayed graph's kernels are the eager pass's): time by kind (matrix products, attention, norms,
elementwise, convolutions) and the costliest kernels.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from convtts.config import ATTENTIONS


def flow_times(
    model, chunk, tokens, precision: str, repeat: int, attention: str = "auto", compile: bool = False
) -> dict:
    """Seconds of an eager pass (at its own size, after a warm-up pass), of the pass that captures the
    shape's step (padded to its bucket), and the median of a few that replay it; and how far the
    replayed mels are from the eager ones (largest absolute difference)."""
    import torch

    from convtts.speak.cosyvoice.engine.flow import Flow
    from convtts.testing.flow_vocoder import make_rows, timed

    inner = model.model
    on_gpu = torch.device(inner.device).type == "cuda"
    wide = dict(spread=100.0, tail_spread=100.0, attention=attention)
    eager = Flow(inner.flow, precision, inner.device, graphs=False, **wide)
    graphed = Flow(inner.flow, precision, inner.device, graphs=on_gpu, compile=compile, **wide)
    graphed.solver.graphs.warm = True  # the eager passes below do the process's lazy set-up
    with torch.inference_mode():
        eager_runs = [timed(lambda: eager.mels(make_rows(chunk, tokens)), inner.device) for _ in range(2)]
        graph_runs = [timed(lambda: graphed.mels(make_rows(chunk, tokens)), inner.device) for _ in range(1 + repeat)]
    reference, replayed = eager_runs[-1][0], graph_runs[-1][0]
    return {
        "eager_s": round(eager_runs[-1][1], 4),
        "capture_s": round(graph_runs[0][1], 4) if on_gpu else None,
        "replay_s": round(statistics.median(run[1] for run in graph_runs[1:]), 4) if on_gpu else None,
        "graphs": graphed.solver.graphs.counts(),
        "kernel": graphed.solver.kernel,
        "max_abs_diff": max(float((a - b).abs().max()) for a, b in zip(reference, replayed)),
    }


def vocoder_times(model, chunk, tokens, precision: str, repeat: int) -> dict:
    """Seconds of the rows in one vocoder pass (median of `repeat`), and of each row alone, summed."""
    import torch

    from convtts.speak.cosyvoice.engine.flow import Flow
    from convtts.speak.cosyvoice.engine.vocoder import Vocoder
    from convtts.testing.flow_vocoder import make_rows, timed

    inner = model.model
    rows = make_rows(chunk, tokens)
    with torch.inference_mode():
        mels = Flow(inner.flow, precision, inner.device).mels(rows)
        together = Vocoder(inner.hift, precision, max_rows=max(2, len(rows)), max_mb=1 << 20)
        alone = Vocoder(inner.hift, precision, max_rows=1)
        requests = [row.request for row in make_rows(chunk, tokens)]
        timed(lambda: together.speak(requests, mels, 1.0), inner.device)  # warm-up (kernels chosen)
        passes = [timed(lambda: together.speak(requests, mels, 1.0), inner.device)[1] for _ in range(repeat)]
        solo = timed(lambda: alone.speak(requests, mels, 1.0), inner.device)[1]
    return {"one_pass_s": round(statistics.median(passes), 4), "each_alone_s": round(solo, 4)}


KINDS = [  # kernel name patterns, first match wins
    ("attention", r"fmha|flash|attention|softmax"),
    ("conv", r"conv|fprop|cudnn|implicit|winograd|fft"),  # cuDNN runs convolutions on cutlass kernels too
    ("matmul", r"gemm|cutlass|xmma|cublas|sm90|sm80_|nvjet|addmm|aten::mm|bmm"),
    ("norm", r"norm"),
    ("copy", r"copy|cat|memcpy|memset|fill"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|activation|gelu|mul|add"),
    ("reduce", r"reduce"),
]


def kernel_profile(fn, top: int = 12) -> dict:
    """What fn runs on the GPU (on a CPU: its torch operators, for a dry run): milliseconds by kind and
    the costliest kernels (name, ms, calls)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    # the CPU's operators too on a GPU: a kernel is put down to the operator that launched it
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn()
        sync()
    kernels: dict = {}
    ops: dict = {}  # by the operator that launched them, under its caller: where in the model they come from
    for event in prof.events():
        if cuda and event.device_type == DeviceType.CUDA:
            us = event.time_range.elapsed_us()
        elif not cuda and event.device_type == DeviceType.CPU:
            us = event.self_cpu_time_total
        else:
            continue
        ms, count = kernels.get(event.name, (0.0, 0))
        kernels[event.name] = (ms + us / 1000, count + 1)
    for event in prof.events():
        launched = [k.duration for k in getattr(event, "kernels", [])] if cuda else [event.self_cpu_time_total]
        if event.device_type != DeviceType.CPU or not launched or not sum(launched):
            continue
        caller = event.cpu_parent.name if event.cpu_parent is not None else ""
        ms, count = ops.get((caller, event.name), (0.0, 0))
        ops[(caller, event.name)] = (ms + sum(launched) / 1000, count + 1)
    kinds: dict = {}
    for name, (ms, _) in kernels.items():
        kind = next((k for k, pattern in KINDS if re.search(pattern, name, re.IGNORECASE)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + ms
    costly = sorted(kernels.items(), key=lambda item: -item[1][0])[:top]
    return {
        "gpu_ms" if cuda else "cpu_ms": round(sum(ms for ms, _ in kernels.values()), 2),
        "launches": sum(count for _, count in kernels.values()),
        "by_kind_ms": {k: round(v, 2) for k, v in sorted(kinds.items(), key=lambda item: -item[1])},
        "top": [[name[:160], round(ms, 2), count] for name, (ms, count) in costly],
        "by_operator": [
            [f"{caller} > {name}", round(ms, 2), count]
            for (caller, name), (ms, count) in sorted(ops.items(), key=lambda item: -item[1][0])[:top]
        ],
    }


def profiles(
    model, chunk, tokens, precision: str, attention: str = "auto", vocoder_precision: str | None = None
) -> dict:
    """kernel_profile of one eager flow pass (after a warm-up) and one vocoder pass of these rows (the vocoder in
    `vocoder_precision`, by default the flow's)."""
    import torch

    from convtts.speak.cosyvoice.engine.flow import Flow
    from convtts.speak.cosyvoice.engine.vocoder import Vocoder
    from convtts.testing.flow_vocoder import make_rows

    inner = model.model
    flow = Flow(inner.flow, precision, inner.device, graphs=False, spread=100.0, tail_spread=100.0, attention=attention)
    with torch.inference_mode():
        mels = flow.mels(make_rows(chunk, tokens))
        vocoder = Vocoder(inner.hift, vocoder_precision or precision, max_rows=max(2, len(tokens)), max_mb=1 << 20)
        requests = [row.request for row in make_rows(chunk, tokens)]
        vocoder.speak(requests, mels, 1.0)
        return {
            "flow": kernel_profile(lambda: flow.mels(make_rows(chunk, tokens))),
            "vocoder": kernel_profile(lambda: vocoder.speak(requests, mels, 1.0)),
        }


def row_frames(model, chunk, tokens) -> int:
    """The padded row-frames of one pass of these rows (the figure profiles.PassCosts prices)."""
    from convtts.speak.cosyvoice.engine.flow import Flow
    from convtts.testing.flow_vocoder import make_rows

    flow = Flow(model.model.flow, "fp32", model.model.device)
    rows = make_rows(chunk, tokens)
    return len(rows) * max(flow.frames(row) for row in rows)


def fit(passes: list[dict]) -> dict:
    """A pass's own price (ms) and its price a padded row-frame (us), by least squares over the
    measured passes: eager, replayed and captured flow passes (one slope, the eager one's), and vocoder
    passes. A profile entry for speak/cosyvoice/engine/profiles.py."""
    frames = [p["row_frames"] for p in passes]

    def line(seconds):
        if len(set(frames)) < 2:
            return None, None
        slope, intercept = statistics.linear_regression(frames, seconds)
        return round(max(intercept, 0.0) * 1000, 2), round(slope * 1e6, 3)

    pass_ms, frame_us = line([p["flow"]["eager_s"] for p in passes])
    vocoder_ms, vocoder_us = line([p["vocoder"]["one_pass_s"] for p in passes])

    def fixed(key):
        times = [p["flow"][key] - (frame_us or 0) * p["row_frames"] / 1e6 for p in passes if p["flow"][key]]
        return round(max(statistics.median(times), 0.0) * 1000, 2) if times else None

    flow = {"pass_ms": pass_ms, "frame_us": frame_us, "replay_ms": fixed("replay_s"), "capture_ms": fixed("capture_s")}
    return {"flow": flow, "vocoder": {"pass_ms": vocoder_ms, "frame_us": vocoder_us}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--runtime-root", default="")
    p.add_argument("--rows", default="1,4,16,64")
    p.add_argument("--seconds", default="1,3,10", help="audio seconds of every row of a pass")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--prompt-seconds", type=float, default=4.0, help="v2/v3: the zero-shot prompt's length")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="also list each pass's GPU kernels")
    p.add_argument("--attention", choices=ATTENTIONS, default="auto", help="tts.cosyvoice.flow.attention")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch

    from convtts.config import CosyVoiceConfig
    from convtts.speak.cosyvoice.runtime import import_runtime, load_model
    from convtts.testing.flow_vocoder import flow_inputs, token_lists

    cosy = CosyVoiceConfig(model_dir=args.model_dir, runtime_root=args.runtime_root)
    import_runtime(cosy)
    model = load_model(cosy)
    chunk = flow_inputs(model, args.prompt_seconds)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    results = {"device": device, "precision": args.precision, "attention": args.attention, "passes": []}
    for seconds in (float(s) for s in args.seconds.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            tokens = token_lists(model, [seconds] * rows)
            figures = {"rows": rows, "seconds": seconds, "audio_s": rows * seconds}
            figures["row_frames"] = row_frames(model, chunk, tokens)
            figures["flow"] = flow_times(model, chunk, tokens, args.precision, args.repeat, args.attention)
            figures["vocoder"] = vocoder_times(model, chunk, tokens, args.precision, args.repeat)
            if args.profile:
                figures["kernels"] = profiles(model, chunk, tokens, args.precision, args.attention)
            results["passes"].append(figures)
            print(orjson.dumps(figures).decode(), flush=True)
            Path(args.out).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    results["profile"] = {"estimator": type(model.model.flow.decoder.estimator).__name__, **fit(results["passes"])}
    Path(args.out).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print("profile for speak/cosyvoice/engine/profiles.py:", orjson.dumps(results["profile"]).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
