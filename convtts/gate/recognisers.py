"""The quality gate's recognisers: each turns 16 kHz mono audio into an English transcript, offline.

`pocketsphinx` (CPU, its wheel ships the model), `hf-whisper` (transformers, batched, on the GPU:
convtts/gate/whisper.py), `whisper` (openai-whisper) and `faster-whisper` (CTranslate2) on local
weights. A recogniser has transcribe(audio); a batched one also transcribe_many(takes).
"""

from __future__ import annotations

import importlib.util

import numpy as np

from convtts.config import ConfigError, ValidateConfig
from convtts.gate.whisper import TransformersWhisper


class PocketSphinx:
    """CMU PocketSphinx with the US English model its wheel ships."""

    def __init__(self, cfg: ValidateConfig):
        from pocketsphinx import Decoder

        self.decoder = Decoder(loglevel="FATAL")

    def transcribe(self, audio16k: np.ndarray) -> str:
        pcm = (np.clip(audio16k, -1.0, 1.0) * 32767).astype("<i2")
        self.decoder.start_utt()
        self.decoder.process_raw(pcm.tobytes(), full_utt=True)
        self.decoder.end_utt()
        hyp = self.decoder.hyp()
        return hyp.hypstr if hyp else ""


class OpenAIWhisper:
    """openai-whisper on a local checkpoint file (whisper.load_model takes a path), one take at a time."""

    def __init__(self, cfg: ValidateConfig):
        import whisper

        self.model = whisper.load_model(cfg.model_path)
        self.fp16 = self.model.device.type == "cuda"

    def transcribe(self, audio16k: np.ndarray) -> str:
        result = self.model.transcribe(
            audio16k, language="en", temperature=0.0, fp16=self.fp16, condition_on_previous_text=False
        )
        return result["text"]


class FasterWhisper:
    """faster-whisper (CTranslate2) on a local model directory, one take at a time."""

    def __init__(self, cfg: ValidateConfig):
        from faster_whisper import WhisperModel

        self.model = WhisperModel(cfg.model_path, device="auto", compute_type="default", local_files_only=True)

    def transcribe(self, audio16k: np.ndarray) -> str:
        segments, _ = self.model.transcribe(audio16k, language="en", beam_size=1, condition_on_previous_text=False)
        return " ".join(s.text for s in segments)


# name -> (class, module it imports, what to pip install)
RECOGNISER_CLASSES = {
    "pocketsphinx": (PocketSphinx, "pocketsphinx", "pocketsphinx==5.0.4"),
    "hf-whisper": (TransformersWhisper, "transformers", "transformers>=5"),
    "whisper": (OpenAIWhisper, "whisper", "openai-whisper"),
    "faster-whisper": (FasterWhisper, "faster_whisper", "faster-whisper"),
}


def check_recogniser_installed(cfg: ValidateConfig) -> None:
    """Before anything starts: the packages the enabled gate's recogniser needs are installed."""
    needed = [("soxr", "soxr")] if cfg.recogniser != "none" else []
    if needed and not cfg.assume_english:
        needed.append(("py3langid", "py3langid"))  # which segments are English: convtts/language.py
    if cfg.recogniser in RECOGNISER_CLASSES:
        needed.append(RECOGNISER_CLASSES[cfg.recogniser][1:])
    for module, package in needed:
        if importlib.util.find_spec(module) is None:
            extra = "validate-gpu" if cfg.recogniser == "hf-whisper" else "validate"
            spec = f"'{package}'" if any(c in package for c in "<>") else package  # quoted for the shell
            raise ConfigError(
                f"validate.recogniser={cfg.recogniser} needs {package}: pip install {spec} "
                f"(or, in the convtts checkout, pip install '.[{extra}]'), or set validate.recogniser=none"
            )


def load_recogniser(cfg: ValidateConfig):
    """The configured recogniser, loaded in this process; None for recogniser: none."""
    return RECOGNISER_CLASSES[cfg.recogniser][0](cfg) if cfg.recogniser != "none" else None
