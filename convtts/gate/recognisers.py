"""The quality gate's recognisers: each turns 16 kHz mono audio into a transcript, offline.

`pocketsphinx` (CPU, its wheel ships the US English model), `hf-whisper` (transformers, batched, on
the GPU: convtts/gate/whisper.py), `whisper` (openai-whisper) and `faster-whisper` (CTranslate2) on
local weights. A recogniser has transcribe(audio, language) and hears(language) (ISO 639-1); a
batched one also transcribe_many(takes, language=...). A multilingual Whisper checkpoint is told the
take's language; an English-only one (`.en`) and pocketsphinx hear English alone.
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

    def hears(self, language: str) -> bool:
        return language == "en"

    def transcribe(self, audio16k: np.ndarray, language: str = "en") -> str:
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
        from whisper.tokenizer import LANGUAGES

        self.model = whisper.load_model(cfg.model_path)
        self.fp16 = self.model.device.type == "cuda"
        self.languages = frozenset(LANGUAGES) if self.model.is_multilingual else frozenset({"en"})

    def hears(self, language: str) -> bool:
        return language in self.languages

    def transcribe(self, audio16k: np.ndarray, language: str = "en") -> str:
        result = self.model.transcribe(
            audio16k, language=language, temperature=0.0, fp16=self.fp16, condition_on_previous_text=False
        )
        return result["text"]


class FasterWhisper:
    """faster-whisper (CTranslate2) on a local model directory, one take at a time."""

    def __init__(self, cfg: ValidateConfig):
        from faster_whisper import WhisperModel

        self.model = WhisperModel(cfg.model_path, device="auto", compute_type="default", local_files_only=True)
        # supported_languages came in faster-whisper 1.0; before it, a multilingual model hears any
        supported = getattr(self.model, "supported_languages", None)
        multilingual = getattr(self.model.model, "is_multilingual", True)
        self.languages = frozenset(supported) if supported else (None if multilingual else frozenset({"en"}))

    def hears(self, language: str) -> bool:
        return self.languages is None or language in self.languages

    def transcribe(self, audio16k: np.ndarray, language: str = "en") -> str:
        segments, _ = self.model.transcribe(audio16k, language=language, beam_size=1, condition_on_previous_text=False)
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
