"""Check the batched engine against upstream's one-at-a-time path on your model: `convtts check-model`.

Speaks a fixed set of texts three times, with the same voices and seeds: (a) upstream's own path in
fp32 (batch_size 1, TF32 off), the reference; (b) the batched engine at the config's settings;
(c) the batched engine at the same settings in fp32. Both engine runs draw with the exact CPU
sampler (tts.cosyvoice.sampler=cpu, upstream's rule per row), so the LLM's speech tokens can be
compared one for one, and the audio of every utterance that decoded the same tokens sample for
sample. (c) against (a) measures the engine's code; (b) against (a) adds the reduced precision.

    convtts check-model --config configs/cosyvoice.yaml --set tts.cosyvoice.model_dir=/models/CosyVoice-300M-SFT
    python -m convtts.speak.cosyvoice.check --config cosyvoice2 --set ... --texts 3   # on a CPU

Prints a table of verdicts (pass, warn, fail) and writes them with the figures as JSON (--out).
Exit 0: every part passed or warned; 1: a part failed (named); 2: a bad config.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from convtts.cli import add_config_args, fail, load_config_or_exit
from convtts.config import ConfigError

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

# Thresholds, in full-scale units of the waveform (1.0 = the clip level).
# The exact sampler in fp32 is upstream's draw, sample for sample (tests/test_cosyvoice_batch.py): any
# token that differs is a fault of the engine's code.
# In tf32, bf16 or fp16 the LLM's log-probabilities move (bf16: by up to 0.06, docs/ARCHITECTURE.md,
# Tolerances), so a draw near a boundary flips and the rest of that sequence differs: over hundreds of
# draws most sequences do, and differing tokens only warn. A broken LLM shows in the lengths instead:
# the tokens of all texts together more than this share away from upstream's fail.
LLM_LENGTH_SHARE = 0.3
# fp32: padded flow passes and batched HiFT stay within 1e-5 of each row alone (docs/ARCHITECTURE.md),
# and whole utterances within 1.2e-7 on random-weight v1, v2 and v3 models on a CPU; a GPU's kernels
# and ten Euler steps of a released model may add to it, so 1e-4 passes and 1e-3 warns.
FP32_PASS, FP32_WARN = 1e-4, 1e-3
# bf16 flow 2e-3 and bf16 vocoder 1e-2 of full scale are the documented bounds; together 1e-2 passes
# (measured 1.1e-3 to 2.6e-3 on the random models), and up to five times that warns.
REDUCED_PASS, REDUCED_WARN = 1e-2, 5e-2
FAIL, WARN, PASS = "fail", "warn", "pass"
SEED = 1000
ONE_AT_A_TIME = "this config speaks one utterance at a time (batch_size 1, fp16, TensorRT or vLLM): no engine to check"


@dataclass
class Spoken:
    """One run's audio and speech tokens (one list per text chunk, as the flow got them), by text index."""

    audio: dict[int, np.ndarray] = field(default_factory=dict)
    tokens: dict[int, list[list[int]]] = field(default_factory=dict)
    sample_rate: int = 0


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
FP32 = [f"tts.cosyvoice.precision.{part}=fp32" for part in ("llm", "flow", "vocoder")]


def speak_upstream(config, work) -> Spoken:
    """Upstream's one-at-a-time path, IEEE fp32, each chunk's tokens read where it hands them to the flow."""
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend
    from convtts.speak.cosyvoice.engine.precision import matmul_mode

    backend = CosyVoiceBackend(config)
    out, inner = Spoken(sample_rate=backend.sample_rate), backend.model.model
    token2wav, chunks = inner.token2wav, []

    def recorded(**kwargs):
        chunks.append(kwargs["token"].reshape(-1).tolist())
        return token2wav(**kwargs)

    inner.token2wav = recorded
    try:
        with matmul_mode("fp32"):
            for key, text, speaker, seed in work:
                chunks.clear()
                out.audio[key] = backend.synthesize(text, speaker, seed)
                out.tokens[key] = list(chunks)
    finally:
        backend.close()
    return out


def speak_engine(config, work) -> Spoken:
    """The batched engine, all texts in one call; each utterance's tokens as its Request kept them."""
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend
    from convtts.speak.cosyvoice.engine.requests import EndlessDecode

    backend = CosyVoiceBackend(config)
    if backend.engine is None:
        backend.close()
        fail(ONE_AT_A_TIME)
    out, engine = Spoken(sample_rate=backend.sample_rate), backend.engine
    speak = engine.speak

    def recorded(requests, **kwargs):
        for request in speak(requests, **kwargs):
            out.tokens[request.key] = [list(t) for t in request.tokens]
            yield request

    engine.speak = recorded
    try:
        for key, audio in backend.synthesize_many(work):
            if isinstance(audio, EndlessDecode):  # upstream's path ran to the bound too, or the tokens say not
                log.warning("utterance %s: %s", key, audio)
                continue
            if isinstance(audio, BaseException):
                raise audio
            out.audio[key] = audio
    finally:
        backend.close()
    return out


def first_divergence(ref: list[list[int]], got: list[list[int]]) -> int:
    """Position (over the chunks' tokens end to end) of the first token that differs; -1 when none does."""
    a, b = [t for chunk in ref for t in chunk], [t for chunk in got for t in chunk]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def compare_tokens(ref: Spoken, got: Spoken) -> dict:
    positions = {key: first_divergence(ref.tokens[key], got.tokens.get(key, [])) for key in ref.tokens}
    differ = {key: pos for key, pos in positions.items() if pos >= 0}
    return {
        "same": len(positions) - len(differ),
        "of": len(positions),
        "first_divergence": {str(key): pos for key, pos in sorted(differ.items())},
        "tokens_upstream": sum(len(c) for chunks in ref.tokens.values() for c in chunks),
        "tokens_engine": sum(len(c) for chunks in got.tokens.values() for c in chunks),
    }


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


def compare_audio(ref: Spoken, got: Spoken, keys: list[int]) -> dict:
    """Waveforms of the utterances in `keys` (those that decoded the same tokens): the worst of each figure."""
    out = {"compared": len(keys), "max_abs": 0.0, "min_snr_db": float("inf"), "max_lsd_db": 0.0, "max_duration_ms": 0.0}
    for key in keys:
        a, b = ref.audio[key], got.audio[key]
        out["max_duration_ms"] = max(out["max_duration_ms"], abs(len(a) - len(b)) / ref.sample_rate * 1000)
        n = min(len(a), len(b))
        out["max_abs"] = max(out["max_abs"], float(np.abs(a[:n] - b[:n]).max()) if n else 0.0)
        out["min_snr_db"] = min(out["min_snr_db"], snr_db(a[:n], b[:n]))
        out["max_lsd_db"] = max(out["max_lsd_db"], log_spectral_distance(a[:n], b[:n]))
    return out


def llm_verdict(figures: dict, reduced: bool) -> str:
    if figures["same"] == figures["of"]:
        return PASS
    if not reduced:
        return FAIL
    upstream, engine = figures["tokens_upstream"], figures["tokens_engine"]
    return WARN if abs(engine - upstream) <= LLM_LENGTH_SHARE * upstream else FAIL


def audio_verdict(figures: dict, reduced: bool) -> str:
    if figures["compared"] == 0:
        return WARN  # every utterance decoded other tokens: the LLM's verdict says why
    if figures["max_duration_ms"] > 0:  # the same tokens make the same number of samples, whatever the precision
        return FAIL
    passes, warns = (REDUCED_PASS, REDUCED_WARN) if reduced else (FP32_PASS, FP32_WARN)
    deviation = figures["max_abs"]
    return PASS if deviation <= passes else WARN if deviation <= warns else FAIL


def judge(ref: Spoken, got: Spoken, precision, parts: tuple[str, ...]) -> dict:
    """The verdicts and figures of `parts` (llm, audio) for one engine run against upstream's."""
    out = {}
    if "llm" in parts:
        tokens = compare_tokens(ref, got)
        out["llm"] = {"verdict": llm_verdict(tokens, is_reduced(precision.llm)), **tokens}
    if "audio" in parts:
        same = [
            key
            for key in ref.tokens
            if key in got.audio and first_divergence(ref.tokens[key], got.tokens.get(key, [])) < 0
        ]
        audio = compare_audio(ref, got, same)
        reduced = is_reduced(precision.flow) or is_reduced(precision.vocoder)
        out["audio"] = {"verdict": audio_verdict(audio, reduced), **audio}
    return out


def describe(part: str, figures: dict) -> str:
    if part == "llm":
        text = f"{figures['same']}/{figures['of']} token sequences identical"
        first = figures["first_divergence"]
        if not first:
            return text
        return text + (
            f"; first divergence at token {min(first.values())}; "
            f"{figures['tokens_engine']} tokens against upstream's {figures['tokens_upstream']}"
        )
    if figures["compared"] == 0:
        return "no utterance decoded upstream's tokens: nothing to compare"
    return (
        f"{figures['compared']} utterances: max |dev| {figures['max_abs']:.2e} of full scale, "
        f"SNR >= {figures['min_snr_db']:.1f} dB, LSD <= {figures['max_lsd_db']:.3f} dB, "
        f"duration +-{figures['max_duration_ms']:.1f} ms"
    )


def table(results: dict) -> str:
    lines = [f"{'part':<6} {'engine run':<44} {'verdict':<7} figures"]
    for run, parts in results.items():
        for part, figures in parts.items():
            lines.append(f"{part:<6} {run:<44} {figures['verdict']:<7} {describe(part, figures)}")
    return "\n".join(lines)


def is_reduced(precision: str) -> bool:
    """Anything but fp32 (tf32 too: 10-bit mantissa products) is held to the reduced formats' bounds."""
    return precision != "fp32"


def plan(args) -> list[tuple[str, object, tuple[str, ...]]]:
    """The engine runs to compare with upstream's: (name, config, parts judged on it).

    The config's own run judges its LLM; where that LLM runs in a reduced format its tokens differ
    from upstream's (see LLM_LENGTH_SHARE), so the config's flow and vocoder are judged on a run
    with the LLM in fp32, whose tokens are upstream's.
    """
    shipped = load_config_or_exit(args, EXACT)
    cosy = shipped.tts.cosyvoice
    if cosy.batch_size == 1 or cosy.fp16 or cosy.load_trt or cosy.load_vllm:
        fail(ONE_AT_A_TIME)
    p = cosy.precision
    exact = ("fp32", load_config_or_exit(args, EXACT + FP32), ("llm", "audio"))
    if not is_reduced(p.llm):
        return [(f"config (flow {p.flow}, vocoder {p.vocoder})", shipped, ("llm", "audio")), exact]
    fp32_llm = load_config_or_exit(args, [*EXACT, "tts.cosyvoice.precision.llm=fp32"])
    return [
        (f"config (llm {p.llm})", shipped, ("llm",)),
        (f"config, llm fp32 (flow {p.flow}, vocoder {p.vocoder})", fp32_llm, ("audio",)),
        exact,
    ]


def run_check(args) -> dict:
    """Upstream's run, then each engine run judged against it: {run: {part: figures}}."""
    runs = plan(args)
    work = items(runs[0][1], args.texts)
    ref = speak_upstream(load_config_or_exit(args, REFERENCE), work)
    return {
        name: judge(ref, speak_engine(config, work), config.tts.cosyvoice.precision, parts)
        for name, config, parts in runs
    }


def failed_parts(results: dict) -> list[str]:
    return [f"{part} ({run})" for run, parts in results.items() for part, f in parts.items() if f["verdict"] == FAIL]


def parse(argv):
    parser = argparse.ArgumentParser(
        prog="convtts check-model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_args(parser)
    parser.add_argument("--texts", type=int, default=len(TEXTS), help=f"how many of the {len(TEXTS)} built-in texts")
    parser.add_argument("--out", default="check-model.json", help="the verdicts and figures as JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.texts <= len(TEXTS):
        parser.error(f"--texts must be between 1 and {len(TEXTS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        results = run_check(args)
    except ConfigError as exc:  # the model directory, a voice or a prompt the load refused
        fail(f"config error: {exc}")
    print(table(results))
    failed = failed_parts(results)
    Path(args.out).write_bytes(
        orjson.dumps(
            {
                "config": args.config,
                "overrides": args.overrides,
                "texts": args.texts,
                "failed": failed,
                "runs": results,
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"written to {args.out}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
