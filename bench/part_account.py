#!/usr/bin/env python3
"""Each part of the engine against the machine's own rates: decode step, prefill, flow pass, vocoder pass.

For one model (v1, v2 or v3) in one process with the GPU to itself, at the shipped precision (bf16):
the machine's dense bf16 matrix rate and copy bandwidth, measured first; then for each part, at a
few sizes, its time (a decode step and a flow pass replayed from their CUDA graphs, as the engine
runs them; a prefill and a vocoder pass eager, as it runs those), the floating-point operations it
does (counted by torch's FlopCounterMode on an eager run of the same shapes: matrix products,
convolutions and attention) and, for the decode step, the bytes it must read (the LLM's weights
once, every row's KV cache). Achieved TFLOP/s and GB/s are set against the measured rates, so a
part far under both is bound by something else: launches, waits, padding or the CPU.

    python3 bench/part_account.py --version 1 --model-dir /tmp/cv-full-v1 --out "$OUT/account-v1.json"
    python3 bench/part_account.py --version 2 --model-dir /tmp/cv-full-v2 --out "$OUT/account-v2.json"
    python3 bench/part_account.py --version 1 --size tiny --decode-rows 2 --prefill-rows 2 --flow-rows 2 \\
        --seconds 0.5 --out /tmp/account.json   # a CPU check on a tiny model

The counted operations are the eager path's with torch's attention over the padded width; the flow
attention kernel and the decode attention kernel skip the padding, so their share of the counted
work is an upper bound. v2/v3 flow passes render the voice prompt's frames as well as the row's:
the operations a second of the row's own audio are given both ways.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import orjson

import batch_engine  # bench/ is on sys.path when run as a script
import pass_cost

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def synchronize(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, device, repeat: int) -> float:
    """Median wall seconds of fn (GPU work included), after one warm-up call."""
    times = []
    for _ in range(repeat + 1):
        synchronize(device)
        started = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def counted(fn) -> tuple[float, dict]:
    """fn's floating-point operations (FlopCounterMode), in all and by operator."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    by_op = {
        str(op).removeprefix("aten.").split(".")[0]: n for op, n in counter.get_flop_counts().get("Global", {}).items()
    }
    return float(counter.get_total_flops()), by_op


def machine_rates(device, repeat: int) -> dict:
    """The device's dense bf16 matrix rate (TFLOP/s) and copy bandwidth (GB/s, bytes read and written)."""
    import torch

    cuda = torch.device(device).type == "cuda"
    n = 8192 if cuda else 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    matmul = median_seconds(lambda: a @ b, device, repeat)
    size = (1 << 30) if cuda else (1 << 26)
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = median_seconds(lambda: target.copy_(source), device, repeat)
    return {"bf16_matmul_tflops": round(2 * n**3 / matmul / 1e12, 3), "copy_gbps": round(2 * size / copy / 1e9, 1)}


def rates(flops: float, seconds: float, machine: dict, bytes_read: float | None = None) -> dict:
    out = {
        "ms": round(seconds * 1000, 3),
        "flop": int(flops),
        "gflop": round(flops / 1e9, 3),
        "tflops": round(flops / seconds / 1e12, 2),
        "of_matmul_rate": round(flops / seconds / 1e12 / machine["bf16_matmul_tflops"], 4),
    }
    if bytes_read is not None:
        out.update(
            mb_read=round(bytes_read / 1e6, 2),
            gbps=round(bytes_read / seconds / 1e9, 1),
            of_copy_rate=round(bytes_read / seconds / 1e9 / machine["copy_gbps"], 4),
        )
    return out


# --- the decode step ------------------------------------------------------------------------------


def decode_runner(engine, attention: str, rows: int, length: int, graphs: bool | None = None):
    from convtts.speak.cosyvoice.engine.runner import DecodeOptions

    graphs = engine.runner.options.cuda_graphs if graphs is None else graphs
    options = DecodeOptions(
        row_tokens=length + 64, attention=attention, cuda_graphs=graphs, compile=engine.runner.options.compile
    )
    runner = type(engine.runner)(engine.llm, engine.device, engine.precision.llm, options)
    runner.prepare(rows)
    return runner


def decode_account(engine, rows: int, length: int, machine: dict, repeat: int) -> dict:
    """One step of `rows` rows at `length` positions: the shipped runner's replayed graph against the
    operations of the same step (torch's attention) and the bytes it must read."""
    import torch

    def at_length(runner):
        runner.cache.lengths.fill_(length - 1)
        return runner

    counting = at_length(decode_runner(engine, "torch", rows, length))
    with counting.precision():
        flops, by_op = counted(lambda: counting.run_step(rows, length))
    cache = counting.cache
    layers, heads, dim = counting.shape
    kv_bytes = 2 * layers * rows * length * heads * dim * cache.k.element_size()
    matmul = sum(n for op, n in by_op.items() if op in ("mm", "addmm", "linear"))
    weight_bytes = matmul / (2 * rows) * cache.k.element_size()  # each weight read once a step, shared by the rows
    counting.release_all()
    shipped = at_length(decode_runner(engine, engine.runner.options.attention, rows, length))
    with torch.inference_mode(), shipped.precision():
        seconds = median_seconds(
            lambda: (shipped.cache.lengths.fill_(length - 1), shipped.graphs.run(rows, length)), engine.device, repeat
        )
    kernel = shipped.kernel
    shipped.release_all()
    figures = {"rows": rows, "positions": length, "kernel": kernel, "weights_mb": round(weight_bytes / 1e6, 1)}
    figures.update(rates(flops, seconds, machine, weight_bytes + kv_bytes))
    figures["ms_per_row"] = round(seconds * 1000 / rows, 4)
    return figures


# --- the prefill ----------------------------------------------------------------------------------


def prefill_fn(engine, rows: int, tokens: int):
    """A padded prefill of `rows` prompts of `tokens` positions through the LLM's layers, as prefill_many runs it."""
    import torch

    runner, device = engine.runner, engine.device
    generator = torch.Generator(device="cpu").manual_seed(0)
    if hasattr(runner, "builder"):  # v2/v3: the Qwen2 backbone
        width = runner.builder.backbone.config.hidden_size
        x = torch.randn(rows, tokens, width, generator=generator).to(device=device, dtype=runner.dtype)
        mask = torch.ones(rows, tokens, dtype=torch.long, device=device)
        return lambda: runner.builder.backbone(inputs_embeds=x, attention_mask=mask, use_cache=True)
    from convtts.speak.cosyvoice.engine.runner_v1 import v1_prefill_rows

    width = engine.llm.llm_input_size
    x = torch.randn(rows, tokens, width, generator=generator).to(device=device, dtype=runner.dtype)
    return lambda: v1_prefill_rows(engine.llm, x, [tokens] * rows)


@contextmanager
def eager_attention(engine):
    """The Qwen2 backbone's attention as plain products while counting: the counter does not take the
    grouped-query shapes of torch's fused attention."""
    config = getattr(getattr(engine.runner, "builder", None), "backbone", None)
    config = getattr(config, "config", None)
    saved = getattr(config, "_attn_implementation", None)
    if config is not None:
        config._attn_implementation = "eager"
    try:
        yield
    finally:
        if config is not None:
            config._attn_implementation = saved


def prefill_account(engine, rows: int, tokens: int, machine: dict, repeat: int) -> dict:
    import torch

    run = prefill_fn(engine, rows, tokens)
    with torch.inference_mode(), engine.runner.precision():
        with eager_attention(engine):
            flops, _ = counted(run)
        seconds = median_seconds(run, engine.device, repeat)
    figures = {"rows": rows, "positions": tokens, **rates(flops, seconds, machine)}
    if getattr(engine.runner, "prefiller", None) is not None:  # v2/v3 on CUDA: our graphed prefill beside it
        figures["own"] = own_prefill_account(engine, rows, tokens, flops, machine, repeat)
    return figures


def own_prefill_account(engine, rows: int, tokens: int, flops: float, machine: dict, repeat: int) -> dict:
    """The runner's own prefill of the same prompts: its time, and how far its last hidden states and first
    layer's keys are from the backbone's (of the reference's largest magnitude)."""
    import torch

    from convtts.speak.cosyvoice.engine.runner_qwen import cache_tensors

    runner, device = engine.runner, engine.device
    generator = torch.Generator(device="cpu").manual_seed(0)
    width = runner.builder.backbone.config.hidden_size
    x = torch.randn(rows, tokens, width, generator=generator).to(device=device, dtype=runner.dtype)
    embedded = list(x)
    with torch.inference_mode(), runner.precision():
        mask = torch.ones(rows, tokens, dtype=torch.long, device=device)
        reference = runner.builder.backbone(inputs_embeds=x, attention_mask=mask, use_cache=True)
        runner.prefiller.run(embedded)
        seconds = median_seconds(lambda: runner.prefiller.run(embedded), device, repeat)
        last = reference.last_hidden_state[:, -1].float()
        keys = cache_tensors(reference.past_key_values)[0].float()
        own_keys = runner.prefiller.keys[0, :rows, :, :tokens].float()
        deviation = {
            "last": float((runner.prefiller.last[:rows].float() - last).abs().max() / last.abs().max()),
            "keys": float((own_keys - keys).abs().max() / keys.abs().max()),
        }
    return {**rates(flops, seconds, machine), "deviation": deviation}


# --- the flow and the vocoder ---------------------------------------------------------------------


def flow_account(
    model, chunk, rows: int, seconds: float, precision: str, machine: dict, repeat: int, compile: bool = False
) -> dict:
    """A flow pass of `rows` rows of `seconds` each: replayed (the shipped attention) against its operations."""
    import torch

    from convtts.speak.cosyvoice.engine.flow import Flow
    from convtts.testing.flow_vocoder import make_rows, token_lists

    inner = model.model
    tokens = token_lists(model, [seconds] * rows)
    eager = Flow(inner.flow, precision, inner.device, graphs=False, spread=100.0, tail_spread=100.0, attention="torch")
    with torch.inference_mode():
        eager.mels(make_rows(chunk, tokens))  # lazy set-up out of the count
        flops, _ = counted(lambda: eager.mels(make_rows(chunk, tokens)))
    times = pass_cost.flow_times(model, chunk, tokens, precision, repeat, compile=compile)
    seconds_of_pass = times["replay_s"] or times["eager_s"]
    prompt_frames = chunk["prompt_speech_feat"].shape[1] if "prompt_speech_feat" in chunk else 0
    own_frames = (
        sum(len(t) for t in tokens) * inner.flow.token_mel_ratio if hasattr(inner.flow, "token_mel_ratio") else 0
    )
    figures = {"rows": rows, "seconds": seconds, "kernel": times["kernel"], **rates(flops, seconds_of_pass, machine)}
    figures["gflop_per_audio_s"] = round(flops / 1e9 / (rows * seconds), 1)
    if prompt_frames and own_frames:
        own_share = own_frames / (own_frames + rows * prompt_frames)
        figures["gflop_per_audio_s_without_prompt"] = round(flops * own_share / 1e9 / (rows * seconds), 1)
    figures["audio_s_per_s"] = round(rows * seconds / seconds_of_pass, 1)
    return figures


def vocoder_account(model, chunk, rows: int, seconds: float, precision: str, machine: dict, repeat: int) -> dict:
    import torch

    from convtts.speak.cosyvoice.engine.flow import Flow
    from convtts.speak.cosyvoice.engine.vocoder import Vocoder
    from convtts.testing.flow_vocoder import make_rows, token_lists

    inner = model.model
    tokens = token_lists(model, [seconds] * rows)
    with torch.inference_mode():
        mels = Flow(inner.flow, precision, inner.device).mels(make_rows(chunk, tokens))
        vocoder = Vocoder(inner.hift, precision, max_rows=max(2, rows), max_mb=1 << 20)
        requests = [row.request for row in make_rows(chunk, tokens)]
        vocoder.speak(requests, mels, 1.0)
        flops, _ = counted(lambda: vocoder.speak(requests, mels, 1.0))
    times = pass_cost.vocoder_times(model, chunk, tokens, precision, repeat)
    figures = {"rows": rows, "seconds": seconds, **rates(flops, times["one_pass_s"], machine)}
    figures["gflop_per_audio_s"] = round(flops / 1e9 / (rows * seconds), 1)
    figures["audio_s_per_s"] = round(rows * seconds / times["one_pass_s"], 1)
    return figures


# --- the kernels of each part (--profile) ---------------------------------------------------------


def part_profiles(backend, config, args) -> dict:
    """pass_cost.kernel_profile of each part run eagerly at the account's largest sizes: a decode step, our
    prefill (v2/v3 on CUDA), a flow pass and a vocoder pass. A replayed graph runs the same kernels without
    the launches, so these say which kernels the GPU's time goes to, not how long a replay takes."""
    import torch

    from convtts.speak.cosyvoice.engine.prefill_qwen import width_bucket
    from convtts.testing.flow_vocoder import flow_inputs, token_lists

    engine, precision = backend.engine, config.tts.cosyvoice.precision
    rows, length = max(ints(args.decode_rows)), args.positions
    found = {}
    with torch.inference_mode():
        runner = decode_runner(engine, engine.runner.options.attention, rows, length, graphs=False)
        with runner.precision():
            runner.cache.lengths.fill_(length - 1)
            runner.run_step(rows, length)  # lazy set-up out of the profile
            runner.cache.lengths.fill_(length - 1)
            found["decode"] = {"rows": rows, **pass_cost.kernel_profile(lambda: runner.run_step(rows, length))}
        runner.release_all()
        prefiller = getattr(engine.runner, "prefiller", None)
        if prefiller is not None:
            prompts = max(ints(args.prefill_rows))
            width = width_bucket(args.prefill_positions)
            with engine.runner.precision():
                prefiller.forward(prompts, width)
                found["prefill"] = {
                    "rows": prompts,
                    **pass_cost.kernel_profile(lambda: prefiller.forward(prompts, width)),
                }
        chunk = flow_inputs(backend.model, args.prompt_seconds)
        seconds = max(float(s) for s in args.seconds.split(","))
        tokens = token_lists(backend.model, [seconds] * max(ints(args.flow_rows)))
        attention = config.tts.cosyvoice.flow.attention
        passes = pass_cost.profiles(backend.model, chunk, tokens, precision.flow, attention, precision.vocoder)
        for part, figures in passes.items():
            found[part] = {"rows": len(tokens), **figures}
    return found


# --- the command ----------------------------------------------------------------------------------


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def build_backend(args):
    from convtts.config import load_config
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    work = Path(tempfile.mkdtemp(prefix="convtts-account-"))
    overrides = [f"tts.cosyvoice.model_dir={batch_engine.model_dir(args)}", *batch_engine.prompt_overrides(args, work)]
    config = load_config(REPO / "configs" / batch_engine.CONFIGS[args.version], overrides + args.set)
    return CosyVoiceBackend(config), config


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--version", type=int, choices=(1, 2, 3), default=1)
    p.add_argument("--model-dir", help="a model directory (default: a random-weight model of --size, written once)")
    p.add_argument("--size", choices=("tiny", "full"), default="full")
    p.add_argument("--decode-rows", default="16,64,128,256")
    p.add_argument("--positions", type=int, default=300, help="KV positions of each row in a timed decode step")
    p.add_argument("--prefill-rows", default="1,16")
    p.add_argument("--prefill-positions", type=int, default=160)
    p.add_argument("--flow-rows", default="16,64")
    p.add_argument("--seconds", default="3,10", help="audio seconds of every row of a flow and vocoder pass")
    p.add_argument("--prompt-seconds", type=float, default=4.0, help="v2/v3: the zero-shot prompt's length")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--set", action="append", default=[], help="a config override (group.key=value)")
    p.add_argument(
        "--profile", action="store_true", help="also each part's GPU kernels (an eager run under torch.profiler)"
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch

    from convtts.testing.flow_vocoder import flow_inputs

    backend, config = build_backend(args)
    engine = backend.engine
    device = engine.device
    precision = config.tts.cosyvoice.precision
    machine = machine_rates(device, args.repeat)
    results = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "version": args.version,
        "precision": {"llm": precision.llm, "flow": precision.flow, "vocoder": precision.vocoder},
        "machine": machine,
        "decode": [],
        "prefill": [],
        "flow": [],
        "vocoder": [],
    }
    out = Path(args.out)

    def record(part: str, figures: dict) -> None:
        results[part].append(figures)
        print(part, orjson.dumps(figures).decode(), flush=True)
        out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))

    print("machine", orjson.dumps(machine).decode(), flush=True)
    engine.runner.release_all()  # the account's runners take the cache's memory in turn
    with torch.inference_mode():
        for rows in ints(args.decode_rows):
            record("decode", decode_account(engine, rows, args.positions, machine, args.repeat))
        for rows in ints(args.prefill_rows):
            record("prefill", prefill_account(engine, rows, args.prefill_positions, machine, args.repeat))
    chunk = flow_inputs(backend.model, args.prompt_seconds)
    flow_compiled = config.tts.cosyvoice.flow.compile
    for seconds in (float(s) for s in args.seconds.split(",")):
        for rows in ints(args.flow_rows):
            record(
                "flow",
                flow_account(backend.model, chunk, rows, seconds, precision.flow, machine, args.repeat, flow_compiled),
            )
            record(
                "vocoder", vocoder_account(backend.model, chunk, rows, seconds, precision.vocoder, machine, args.repeat)
            )
    if args.profile:
        for part, figures in part_profiles(backend, config, args).items():
            results.setdefault("kernels", {})[part] = figures
            print(f"kernels {part}", orjson.dumps(figures).decode()[:1500], flush=True)
            out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
