"""Check the batched engine against upstream's one-at-a-time path on your model: `convtts check-model`.

Speaks a fixed set of texts with the same voices and seeds: first upstream's own path in fp32
(batch_size 1, TF32 off), the reference, recording at each step of its LLM the distribution, the
random state and the token it drew; then the batched engine at the config's settings and, where
the config reduces a part, again in fp32. The engine runs on upstream's histories: at each step
its own sampler draws from upstream's random state and is scored, then the step takes upstream's
token. So the LLM is judged by how far its distributions sit from upstream's (and how often its
own draw differs), and the flow and vocoder by the audio of every utterance, sample for sample,
at any precision. The fp32 run measures the engine's code; the config's adds its formats.

    convtts check-model --config configs/cosyvoice.yaml --set tts.cosyvoice.model_dir=/models/CosyVoice-300M-SFT
    python -m convtts.speak.cosyvoice.check --config cosyvoice2 --set ... --texts 3   # on a CPU

Prints a table of verdicts (pass, warn, fail) and writes them with the figures as JSON (--out).
Exit 0: every part passed or warned; 1: a part failed (named); 2: a bad config.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import orjson

from convtts.cli import add_config_args, fail, load_config_or_exit
from convtts.config import ConfigError, load_config
from convtts.speak.cosyvoice.replay import Draws, ForcedDraws, Recorder, Spoken

log = logging.getLogger(__name__)

TEXTS = [  # English and Chinese in turn, short to long: the first few hold both languages
    "Yes.",
    "你好。",
    "Thank you very much.",
    "谢谢你的帮助。",
    "The weather was lovely this morning.",
    "今天天气很好，我们去公园散步吧。",
    "A brown dog runs across a green field.",
    "这本书我已经读了三遍，每次都有新的收获。",
    "It weighs 3.5 kilograms and costs twelve dollars.",
    "火车将在下午三点十五分到达北京南站，请提前做好准备。",
    "Could you tell me where the nearest train station is?",
    "他一边听音乐，一边做作业，妈妈说这样效率不高，但他觉得没有关系。",
    "We walked to the harbour and watched the boats come in, one after another, until the sun went down.",
    "The word for thank you in Chinese is 谢谢, and it is one of the first words people learn.",
    "The first sentence is short. The second one follows it, and it is a little longer than the first.",
    "我们明天上午九点在图书馆门口见面，然后一起去吃早饭，好吗？",
    "Please remember to water the plants on Tuesday, feed the cat twice a day, and lock the back door.",
    "In 1969, two astronauts walked on the Moon while a third one waited for them in orbit above.",
    "She said that the meeting had been moved to Friday afternoon, so nobody would need to come in early.",
    "Reading a good book on a rainy evening, with a cup of tea beside you, is one of life's quiet pleasures.",
]

# The LLM is run on upstream's histories (ForcedDraws) and judged by the total variation distance (TV)
# between its distribution and upstream's at each step: the chance that one shared random number
# draws two different tokens. fp32 measures 2e-7 to 4e-7 on random v1 and v2 models, on a CPU and
# on an H100 alike (only the order of the sums differs), and up to 5.3e-5 on the random v3 model,
# whose distributions move a hundred times as much for the same rounding. bf16 moves the
# log-probabilities by up to 0.06 (docs/ARCHITECTURE.md, Tolerances); a wrong prompt or cache moves
# them by far more.
FP32_TV_PASS, FP32_TV_WARN = 1e-4, 1e-3
REDUCED_TV_PASS, REDUCED_TV_WARN = 0.05, 0.15
# With upstream's random state at every step, the engine's own fp32 draw is upstream's but where a
# near tie reorders the nucleus (none in 912 steps on a CPU); a sampler that breaks upstream's rule
# differs at most steps. In a reduced format near ties are common on a flat distribution (bf16: a
# sixth of the steps of a random model at TV 2e-3), so there the count is shown, not judged.
FLIPS_SLACK, FLIPS_SHARE = 2, 0.01
# The audio's, in full-scale units of the waveform (1.0 = the clip level).
# fp32: padded flow passes and batched HiFT stay within 1e-5 of each row alone (docs/ARCHITECTURE.md),
# and whole utterances within 1.2e-7 on random-weight v1, v2 and v3 models on a CPU; on an H100 the
# GPU's kernels, chosen by the batch's shape, make it 1.02e-4 (v1), 1.01e-4 (v2) and 7.1e-5 (v3) at
# 57-67 dB SNR: three times that passes, and up to 1e-3 warns.
FP32_PASS, FP32_WARN = 3e-4, 1e-3
# bf16 flow 2e-3 and bf16 vocoder 1e-2 of full scale are the documented bounds; together 1e-2 passes
# (measured 1.1e-3 to 2.6e-3 on the random models), and up to five times that warns.
REDUCED_PASS, REDUCED_WARN = 1e-2, 5e-2
FAIL, WARN, PASS = "fail", "warn", "pass"
SEED = 1000
ONE_AT_A_TIME = "this config speaks one utterance at a time (batch_size 1, fp16, TensorRT or vLLM): no engine to check"


def voices(config) -> list[str]:
    names = list(config.speakers.voices) or list(config.tts.cosyvoice.prompts)
    if not names:
        fail("the config names no voice (speakers.voices, or tts.cosyvoice.prompts)")
    return names[:2]


def items(config, count: int) -> list[tuple[int, str, str, int]]:
    names = voices(config)
    return [(i, text, names[i % len(names)], SEED + i) for i, text in enumerate(TEXTS[:count])]


REFERENCE = [
    "tts.cosyvoice.batch_size=1",
    "tts.cosyvoice.batch_size_with_room=0",
    "tts.cosyvoice.fp16=false",
    "tts.cosyvoice.load_jit=false",
    "tts.cosyvoice.load_trt=false",
    "tts.cosyvoice.load_vllm=false",
]
EXACT = ["tts.cosyvoice.sampler=cpu"]
PARTS, FORMATS = ("llm", "flow", "vocoder"), ("tf32", "bf16", "fp16")
FP32 = [f"tts.cosyvoice.precision.{part}=fp32" for part in PARTS]


def speak_upstream(config, work) -> Spoken:
    """Upstream's one-at-a-time path in IEEE fp32, each chunk's draws recorded (Recorder)."""
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend
    from convtts.speak.cosyvoice.engine.precision import matmul_mode

    backend = CosyVoiceBackend(config)
    out = Spoken(sample_rate=backend.sample_rate)
    try:
        with matmul_mode("fp32"), Recorder(backend.model.model) as recorder:
            for key, text, speaker, seed in work:
                out.chunks[key] = recorder.utterance(seed)
                out.audio[key] = backend.synthesize(text, speaker, seed)
    finally:
        backend.close()
    return out


def speak_engine(config, reference: Spoken, work) -> tuple[Spoken, Draws]:
    """The batched engine, all texts in one call, its draws replaced by upstream's (ForcedDraws)."""
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend
    from convtts.speak.cosyvoice.engine.requests import EndlessDecode

    backend = CosyVoiceBackend(config)
    if backend.engine is None:
        backend.close()
        fail(ONE_AT_A_TIME)
    out, engine = Spoken(sample_rate=backend.sample_rate), backend.engine
    forced = engine.sampler = ForcedDraws(engine.sampler, reference)
    speak = engine.speak

    def recorded(requests, **kwargs):
        for request in speak(requests, **kwargs):
            out.tokens[request.key] = [list(t) for t in request.tokens]
            yield request

    engine.speak = recorded
    try:
        for key, audio in backend.synthesize_many(work):
            if isinstance(audio, EndlessDecode):  # upstream's tokens ran to the bound too
                log.warning("utterance %s: %s", key, audio)
                out.endless.add(key)
            elif isinstance(audio, BaseException):
                raise audio
            else:
                out.audio[key] = audio
    finally:
        backend.close()
    return out, forced.draws


def log_spectral_distance(ref: np.ndarray, got: np.ndarray, sizes=(512, 1024, 2048)) -> float:
    """Mean over STFT resolutions of the log-spectral distance in dB (RMS over bins, mean over frames)."""
    distances = []
    for size in sizes:
        a, b = _magnitudes(ref, size), _magnitudes(got, size)
        diff = 20 * np.log10(a + 1e-5) - 20 * np.log10(b + 1e-5)
        distances.append(float(np.sqrt((diff**2).mean(axis=1)).mean()))
    return float(np.mean(distances))


def _magnitudes(audio: np.ndarray, size: int) -> np.ndarray:
    hop = size // 4
    audio = np.pad(audio.astype(np.float64), (0, max(0, size - len(audio))))
    frames = np.lib.stride_tricks.sliding_window_view(audio, size)[::hop]
    return np.abs(np.fft.rfft(frames * np.hanning(size), axis=1))


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise))


def compare_audio(ref: Spoken, got: Spoken) -> dict:
    """Every utterance's waveform against upstream's: the worst of each figure."""
    keys = [key for key in ref.audio if key in got.audio]
    out = {
        "compared": len(keys),
        "missing": len(ref.audio) - len(keys) - len(got.endless),
        "endless": len(got.endless),
        "other_tokens": sum(got.tokens.get(key) != [c.flow_tokens for c in ref.chunks[key]] for key in keys),
        "max_abs": 0.0,
        "min_snr_db": float("inf"),
        "max_lsd_db": 0.0,
        "max_duration_ms": 0.0,
    }
    for key in keys:
        a, b = ref.audio[key], got.audio[key]
        out["max_duration_ms"] = max(out["max_duration_ms"], abs(len(a) - len(b)) / ref.sample_rate * 1000)
        n = min(len(a), len(b))
        out["max_abs"] = max(out["max_abs"], float(np.abs(a[:n] - b[:n]).max()) if n else 0.0)
        out["min_snr_db"] = min(out["min_snr_db"], snr_db(a[:n], b[:n]))
        out["max_lsd_db"] = max(out["max_lsd_db"], log_spectral_distance(a[:n], b[:n]))
    return out


def llm_verdict(figures: dict, reduced: bool) -> str:
    if figures["unmatched_chunks"] or not figures["steps"]:
        return FAIL
    tv_pass, tv_warn = (REDUCED_TV_PASS, REDUCED_TV_WARN) if reduced else (FP32_TV_PASS, FP32_TV_WARN)
    flips = figures["steps"] - figures["agree"]
    if figures["max_tv"] > tv_warn or not reduced and flips > max(FLIPS_SLACK, FLIPS_SHARE * figures["steps"]):
        return FAIL
    return PASS if figures["max_tv"] <= tv_pass else WARN


def audio_verdict(figures: dict, reduced: bool) -> str:
    if figures["missing"] or figures["other_tokens"] or figures["max_duration_ms"] > 0:
        return FAIL  # the same tokens make the same number of samples, whatever the precision
    if figures["compared"] == 0:
        return WARN  # every utterance ran to the decode's bound, which the engine holds back
    passes, warns = (REDUCED_PASS, REDUCED_WARN) if reduced else (FP32_PASS, FP32_WARN)
    deviation = figures["max_abs"]
    return PASS if deviation <= passes else WARN if deviation <= warns else FAIL


def judge(ref: Spoken, got: Spoken, draws: Draws, precision) -> dict:
    """The verdicts and figures of the LLM and the audio for one engine run against upstream's."""
    llm, audio = draws.figures(), compare_audio(ref, got)
    reduced = is_reduced(precision.flow) or is_reduced(precision.vocoder)
    return {
        "llm": {"verdict": llm_verdict(llm, is_reduced(precision.llm)), **llm},
        "audio": {"verdict": audio_verdict(audio, reduced), **audio},
    }


def describe(part: str, figures: dict) -> str:
    if part == REFUSED:
        return figures["reason"]
    if part == "llm":
        text = (
            f"{figures['agree']}/{figures['steps']} draws upstream's; "
            f"distributions within TV {figures['max_tv']:.1e} (mean {figures['mean_tv']:.1e})"
        )
        unmatched = figures["unmatched_chunks"]
        return text + (f"; {unmatched} chunks upstream did not decode" if unmatched else "")
    text = (
        f"{figures['compared']} utterances: max |dev| {figures['max_abs']:.2e} of full scale, "
        f"SNR >= {figures['min_snr_db']:.1f} dB, LSD <= {figures['max_lsd_db']:.3f} dB, "
        f"duration +-{figures['max_duration_ms']:.1f} ms"
    )
    wrong = [f"{figures[k]} {k.replace('_', ' ')}" for k in ("missing", "other_tokens", "endless") if figures[k]]
    return text + (f"; {', '.join(wrong)}" if wrong else "")


def table(results: dict) -> str:
    lines = [f"{'part':<6} {'engine run':<44} {'verdict':<7} figures"]
    for run, parts in results.items():
        for part, figures in parts.items():
            lines.append(f"{part:<6} {run:<44} {figures['verdict']:<7} {describe(part, figures)}")
    return "\n".join(lines)


def is_reduced(precision: str) -> bool:
    """Anything but fp32 (tf32 too: 10-bit mantissa products) is held to the reduced formats' bounds."""
    return precision != "fp32"


def plan(args) -> list[tuple[str, object]]:
    """The engine runs to compare with upstream's: the config's own, and the same in fp32 (which
    measures the engine's code alone) where the config reduces a part."""
    shipped = load_config_or_exit(args, EXACT)
    cosy = shipped.tts.cosyvoice
    if cosy.batch_size == 1 or cosy.fp16 or cosy.load_trt or cosy.load_vllm:
        fail(ONE_AT_A_TIME)
    p = cosy.precision
    exact = ("fp32", load_config_or_exit(args, EXACT + FP32))
    if not any(is_reduced(getattr(p, part)) for part in PARTS):
        return [exact]
    return [(f"config (llm {p.llm}, flow {p.flow}, vocoder {p.vocoder})", shipped), exact]


REFUSED = "refused"


def format_run(part: str, name: str) -> str:
    """The name of --formats' run of `part` in format `name`."""
    return f"{part} {name} (the rest fp32)"


def format_runs(args) -> list[tuple[str, object]]:
    """--formats: each part alone in each reduced format, the others in fp32: (run, its config, or the
    reason the config refuses it)."""
    runs = []
    for part in PARTS:
        for name in FORMATS:
            setting = f"tts.cosyvoice.precision.{part}={name}"
            try:
                config = load_config(args.config, [*args.overrides, *EXACT, *FP32, setting])
            except ConfigError as exc:
                config = str(exc)
            runs.append((format_run(part, name), config))
    return runs


def run_check(args) -> tuple[dict, dict]:
    """Upstream's run, then each engine run judged against it: ({run: {part: figures}}, the same for
    the runs of --formats)."""
    runs = plan(args)
    work = items(runs[0][1], args.texts)
    ref = speak_upstream(load_config_or_exit(args, REFERENCE), work)
    results, formats = {}, {}
    for name, config in runs:
        got, draws = speak_engine(config, ref, work)
        results[name] = judge(ref, got, draws, config.tts.cosyvoice.precision)
    for name, config in format_runs(args) if args.formats else ():
        if isinstance(config, str):
            formats[name] = {REFUSED: {"verdict": REFUSED, "reason": config}}
            continue
        got, draws = speak_engine(config, ref, work)
        formats[name] = judge(ref, got, draws, config.tts.cosyvoice.precision)
    return results, formats


def settings_that_pass(results: dict, formats: dict) -> dict:
    """For each part, its formats by verdict: fp32 as the fp32 run judged it, each other as its own
    run did (the worse of its two verdicts), or refused by the config."""
    order = [PASS, WARN, FAIL, REFUSED]
    fp32 = results.get("fp32", {})
    out = {part: {verdict: [] for verdict in order} for part in PARTS}
    for part in PARTS:
        if fp32:
            out[part][max((f["verdict"] for f in fp32.values()), key=order.index)].append("fp32")
        for name in FORMATS:
            run = formats.get(format_run(part, name))
            if run:
                out[part][max((f["verdict"] for f in run.values()), key=order.index)].append(name)
    return out


def describe_settings(settings: dict) -> str:
    lines = ["formats by part (each alone, the rest fp32):"]
    for part, verdicts in settings.items():
        said = [f"{verdict} {', '.join(names)}" for verdict, names in verdicts.items() if names]
        lines.append(f"  {part:<8} {'; '.join(said)}")
    return "\n".join(lines)


def failed_parts(results: dict) -> list[str]:
    return [f"{part} ({run})" for run, parts in results.items() for part, f in parts.items() if f["verdict"] == FAIL]


def parse(argv):
    parser = argparse.ArgumentParser(
        prog="convtts check-model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_args(parser)
    parser.add_argument("--texts", type=int, default=len(TEXTS), help=f"how many of the {len(TEXTS)} built-in texts")
    parser.add_argument("--out", default="check-model.json", help="the verdicts and figures as JSON")
    parser.add_argument(
        "--formats",
        action="store_true",
        help="also each part alone in tf32, bf16 and fp16 (the rest fp32), and which formats pass; "
        "nine more engine runs, judged but not counted in the exit code",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.texts <= len(TEXTS):
        parser.error(f"--texts must be between 1 and {len(TEXTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        results, formats = run_check(args)
    except ConfigError as exc:  # the model directory, a voice or a prompt the load refused
        fail(f"config error: {exc}")
    print(table(results))
    report = {"config": args.config, "overrides": args.overrides, "texts": args.texts}
    report |= {"failed": failed_parts(results), "runs": results}
    if formats:
        report |= {"formats": formats, "settings": settings_that_pass(results, formats)}
        print(table(formats))
        print(describe_settings(report["settings"]))
    Path(args.out).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(f"written to {args.out}")
    if report["failed"]:
        print(f"failed: {', '.join(report['failed'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
