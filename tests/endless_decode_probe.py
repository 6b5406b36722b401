"""Speaks texts through the batched engine on a model whose end token is never drawn; prints a JSON report.

    python tests/endless_decode_probe.py MODEL_DIR [PROMPT_WAV PROMPT_TEXT]

Run in a fresh interpreter (test_cosyvoice_bounded.py), so that a v3 model loads its runtime from
$COSYVOICE_ROOT. Without a prompt the model's first built-in speaker speaks (v1).
"""

from __future__ import annotations

import json
import sys
import time

TEXTS = [
    "The weather was lovely this morning.",
    "Yes.",
    "We walked to the harbour and watched the boats come in.",
    "A cat sat on the mat.",
]
ROWS = 3
SEEDS = range(1000, 1006)  # twice as many utterances as rows: freed rows are taken again


def backend_for(model_dir: str, prompt: list[str]):
    from convtts.config import Config, CosyVoiceConfig, PrecisionConfig, PromptVoice, SpeakerConfig, TTSConfig
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend
    from convtts.speak.cosyvoice.voice_check import builtin_speakers

    prompts = {"anna": PromptVoice(audio=prompt[0], text=prompt[1])} if prompt else {}
    voice = "anna" if prompt else builtin_speakers(model_dir)[0]
    # fp32: upstream's own path can still run the model's LLM (a cast one it cannot)
    cosy = CosyVoiceConfig(
        model_dir=model_dir, batch_size=ROWS, prompts=prompts, precision=PrecisionConfig("fp32", "fp32", "fp32")
    )
    config = Config(speakers=SpeakerConfig(voices=(voice,), policy="single"), tts=TTSConfig(cosyvoice=cosy))
    return CosyVoiceBackend(config), voice


def said(error: BaseException) -> str:
    """An error as a failure row's reason gives it: its type, then its text."""
    return f"{type(error).__name__}: {error}"


def alone(backend, item, batched) -> list:
    """[what the engine with one row makes of the item: its samples or its error, the batched take's largest
    deviation from it (None where either has no audio)]."""
    import numpy as np

    [(_, audio)] = list(backend.synthesize_many([item]))
    if isinstance(audio, BaseException):
        return [said(audio), None]
    if isinstance(batched, BaseException) or len(batched) != len(audio):
        return [len(audio), None]
    return [len(audio), float(np.abs(batched - audio).max())]


def main(model_dir: str, *prompt: str) -> dict:
    from convtts.speak.cosyvoice.engine.kvcache import round_capacity
    from convtts.testing.cosyvoice_v1 import text_token_counts

    backend, voice = backend_for(model_dir, list(prompt))
    engine = backend.engine
    items = [(i, TEXTS[i % len(TEXTS)], voice, seed) for i, seed in enumerate(SEEDS)]
    started, returned, takes = time.perf_counter(), [], {}
    for key, result in backend.synthesize_many(items):
        returned.append([key, said(result) if isinstance(result, BaseException) else len(result)])
        takes[key] = result
    wall = time.perf_counter() - started
    report = {
        "texts": [text for _, text, _, _ in items],
        "text_tokens": [text_token_counts(backend.model.frontend, text) for _, text, _, _ in items],
        "returned": returned,
        "seconds": wall,
        "cache_planned": round_capacity(engine.options.row_tokens),
        "cache_after": engine.runner.cache.capacity,
        "ratios": list(engine.ratios),
    }
    backend.engine = type(engine)(backend.model, 1, engine.precision, engine.options, backend.cosy)
    report["alone"] = [alone(backend, item, takes[item[0]]) for item in items]
    backend.engine = None  # upstream's own one-at-a-time path, for the first text
    report["upstream_samples"] = len(backend.synthesize(items[0][1], voice, items[0][3]))
    backend.close()
    return report


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
