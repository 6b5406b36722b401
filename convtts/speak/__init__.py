"""TTS backends behind one interface; `check_backend` runs before any worker, `build_backend` inside each.

`tts.backend` is `piper`, `cosyvoice`, `silence` (benchmarking: silence of the planned length), or
`package.module:Class` for a backend of your own: a class deriving from `convtts.speak.base.Backend`
(or `BatchedBackend`) and taking the Config; base.py declares everything the run stage reads of it
and the defaults of what it may leave out (`check`, `resources`, `languages`, ...).

`voice_languages` is what the plan asks: a lookup of data, with no voice code imported.
"""

from __future__ import annotations

import importlib
import json

from convtts.config import SHIPPED_CONFIG_DIRS, Config, ConfigError, load_config
from convtts.speak.base import Backend, BatchedBackend, Resources, SynthesisError

__all__ = [
    "Backend",
    "BatchedBackend",
    "Resources",
    "SynthesisError",
    "backend_class",
    "backend_resources",
    "build_backend",
    "check_backend",
    "sized",
    "voice_languages",
]

BUILT_IN = {
    "piper": ("convtts.speak.piper", "PiperBackend"),
    "cosyvoice": ("convtts.speak.cosyvoice.backend", "CosyVoiceBackend"),
    "silence": ("convtts.speak.silence", "SilenceBackend"),
}


# CosyVoice-300M-SFT's speakers and CosyVoice2 speak these; Fun-CosyVoice3 five more besides.
COSYVOICE_LANGUAGES = frozenset({"zh", "en", "ja", "ko", "yue"})
COSYVOICE3_LANGUAGES = COSYVOICE_LANGUAGES | {"de", "es", "fr", "it", "ru"}


def voice_languages(config: Config) -> frozenset[str] | None:
    """The languages (ISO 639-1) the configured voice speaks; None: any (the silence voice)."""
    name = config.tts.backend
    if name == "silence":
        return None
    if name == "piper":
        return _piper_languages(config)
    if name == "cosyvoice":
        v3 = "cosyvoice3" in config.tts.cosyvoice.model_dir.lower()
        return COSYVOICE3_LANGUAGES if v3 else COSYVOICE_LANGUAGES
    languages = backend_class(name).languages
    return frozenset(languages) if languages else None


def _piper_languages(config: Config) -> frozenset[str] | None:
    """A Piper voice speaks one language: its .onnx.json's (language.family, or espeak's voice)."""
    from convtts.speak.piper import voice_files

    try:
        voice = json.loads(voice_files(config.tts.piper)[1].read_text())
        family = (voice.get("language") or {}).get("family") or voice["espeak"]["voice"].split("-")[0]
    except (OSError, ValueError, KeyError, AttributeError, ConfigError):
        return None  # check_backend names what is wrong with the voice
    return frozenset({family.lower()})


def configs_speaking(language: str) -> list[str]:
    """The shipped configs (configs/NAME.yaml) whose voice speaks `language`."""
    paths = {p.name: p for folder in reversed(SHIPPED_CONFIG_DIRS) for p in folder.glob("*.yaml")}
    speakers = {name: voice_languages(load_config(path)) for name, path in sorted(paths.items())}
    return [f"configs/{name}" for name, speaks in speakers.items() if speaks is None or language in speaks]


def backend_class(name: str) -> type[Backend]:
    """The class `tts.backend` names: a built-in voice's, or package.module:Class deriving from Backend."""
    module_name, _, class_name = name.partition(":")
    module_name, class_name = BUILT_IN.get(name, (module_name, class_name))
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"tts.backend {name!r} cannot be loaded: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"tts.backend {name!r} is not a class deriving from convtts.speak.base.Backend")
    return cls


def check_backend(config: Config) -> None:
    """Fail fast (ConfigError) on a backend that cannot run: missing model, unknown speakers."""
    backend_class(config.tts.backend).check(config)


def build_backend(config: Config) -> Backend:
    """Load the configured backend in this process."""
    return backend_class(config.tts.backend)(config)


def backend_resources(config: Config, device: str) -> Resources:
    """What a worker of the configured backend needs on `device`; a name that is neither built in nor
    package.module:Class has the defaults (check_backend refuses it)."""
    if config.tts.backend not in BUILT_IN and ":" not in config.tts.backend:
        return Resources()
    return backend_class(config.tts.backend).resources(config, device)


def sized(config: Config, rows: int, pass_mb: int = 0) -> Config:
    """The config with the backend's rows (and pass budget, unless 0) set as the slot sized them."""
    return backend_class(config.tts.backend).sized(config, rows, pass_mb)
