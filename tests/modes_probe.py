"""Speaks texts with a cross-lingual or instruct voice three ways; prints a JSON report.

    python tests/modes_probe.py MODEL_DIR PROMPT_WAV MODE [INSTRUCT]
    python tests/modes_probe.py MODEL_DIR speaker:NAME instruct INSTRUCT    # CosyVoice-300M-Instruct

Upstream's own call with no registered voice (inference_cross_lingual / inference_instruct2, the
reference, its draws recorded), our one-at-a-time path (the same call on the voice's registered
features), the batched engine of one row, and of four on upstream's histories (check-model's
forced draws: a near tie that a batched sum's rounding flips costs that one draw, not the rest of
the utterance). Run in a fresh interpreter (test_cosyvoice_modes.py), so that a v3 model loads
its runtime from $COSYVOICE_ROOT.
"""

from __future__ import annotations

import json
import sys

TEXTS = [
    "The weather was lovely this morning.",
    "We walked to the harbour and watched the boats come in, one after another, until the sun went down.",
    "A cat sat on the mat.",
    "Yes.",
    "The second sentence is here. And a third one follows it, a little longer than the others.",
]
ROWS = 4
SEED = 1000


def backend_for(model_dir: str, prompt_wav: str, mode: str, instruct: str, rows: int):
    from convtts.config import Config, CosyVoiceConfig, PrecisionConfig, PromptVoice, SpeakerConfig, TTSConfig
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    told = prompt_wav.removeprefix("speaker:") if prompt_wav.startswith("speaker:") else ""
    voice = PromptVoice(audio="" if told else prompt_wav, mode=mode, instruct=instruct, speaker=told)
    # fp32: upstream's own path can still run the model's LLM (a cast one it cannot)
    cosy = CosyVoiceConfig(
        model_dir=model_dir, batch_size=rows, prompts={"anna": voice}, precision=PrecisionConfig("fp32", "fp32", "fp32")
    )
    config = Config(speakers=SpeakerConfig(voices=("anna",), policy="single"), tts=TTSConfig(cosyvoice=cosy))
    return CosyVoiceBackend(config)


def upstream(backend, text: str, seed: int):
    """Upstream's call as its README shows it, the recording given, no voice registered."""
    import numpy as np

    from convtts.speak.cosyvoice.prompts import load_prompt_16k, spoken_prefix
    from convtts.speak.cosyvoice.reproducible import seed_everything
    from convtts.speak.cosyvoice.text_frontend import frontend_split

    prompt, model = backend.prompts["anna"], backend.model
    seed_everything(seed)
    if prompt.speaker:
        outputs = list(model.inference_instruct(text, prompt.speaker, prompt.instruct, stream=False))
        return np.concatenate([out["tts_speech"].numpy().reshape(-1) for out in outputs])
    audio = prompt.audio if backend.registered.takes_path else load_prompt_16k(prompt.audio)
    if prompt.mode == "instruct":
        outputs = list(model.inference_instruct2(text, prompt.instruct, audio, stream=False))
    else:
        prefix = spoken_prefix(prompt, backend.version)
        parts = frontend_split(model.frontend, text, True) if prefix else [text]
        outputs = [
            out
            for part in parts
            for out in model.inference_cross_lingual(prefix + part, audio, stream=False, text_frontend=not prefix)
        ]
    return np.concatenate([out["tts_speech"].numpy().reshape(-1) for out in outputs])


def deviation(a, b) -> float | None:
    import numpy as np

    return float(np.abs(a - b).max()) if len(a) == len(b) else None


def main(model_dir: str, prompt_wav: str, mode: str, instruct: str = "") -> dict:
    from convtts.speak.cosyvoice.replay import ForcedDraws, Recorder, Spoken

    backend = backend_for(model_dir, prompt_wav, mode, instruct, ROWS)
    items = [(i, text, "anna", SEED + i) for i, text in enumerate(TEXTS)]
    recorded = Spoken()
    with Recorder(backend.model.model) as recorder:
        reference = []
        for key, text, _, seed in items:
            recorded.chunks[key] = recorder.utterance(seed)
            reference.append(upstream(backend, text, seed))
    forced = backend.engine.sampler = ForcedDraws(backend.engine.sampler, recorded)
    batched = dict(backend.synthesize_many(items))
    chunk = backend._chunks(TEXTS[0], "anna")[0]
    engine = backend.engine
    backend.engine = type(engine)(backend.model, 1, engine.precision, engine.options, backend.cosy)
    one_row = {key: audio for item in items for key, audio in backend.synthesize_many([item])}
    backend.engine = None  # our one-at-a-time path: upstream's call on the registered voice
    solo = [backend.synthesize(text, "anna", seed) for _, text, _, seed in items]
    report = {
        "samples": [len(audio) for audio in reference],
        "batched": [deviation(batched[i], reference[i]) for i in range(len(TEXTS))],
        "batched_draws": forced.draws.figures(),
        "one_row": [deviation(one_row[i], reference[i]) for i in range(len(TEXTS))],
        "solo": [deviation(solo[i], reference[i]) for i in range(len(TEXTS))],
        "chunk_keys": sorted(chunk),
        "prompt_text": chunk["prompt_text"].reshape(-1).tolist() if "prompt_text" in chunk else None,
        "text": chunk["text"].reshape(-1).tolist(),
        "instruct_tokens": backend.model.frontend._extract_text_token(instruct)[0].reshape(-1).tolist(),
        "version": backend.version,
    }
    backend.close()
    return report


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
