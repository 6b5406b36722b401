"""TTS backends behind one interface; `check_backend` runs before any worker, `build_backend` inside each.

`tts.backend` is `piper`, `cosyvoice`, `silence` (benchmarking: silence of the planned length), or
`package.module:Class` for a backend of your own: a class
taking the Config, with the Backend attributes and methods, and optionally a `check(config)` static
method that raises ConfigError before any worker starts.
"""
from __future__ import annotations

import importlib

from convtts.backends.base import Backend, SynthesisError
from convtts.config import Config, ConfigError
from convtts.quality import check_gate

__all__ = ["Backend", "SynthesisError", "build_backend", "check_backend"]

BUILT_IN = {
    "piper": ("convtts.backends.piper", "PiperBackend"),
    "cosyvoice": ("convtts.backends.cosyvoice", "CosyVoiceBackend"),
    "silence": ("convtts.backends.silence", "SilenceBackend"),
}


def backend_class(name: str):
    module_name, _, class_name = name.partition(":")
    module_name, class_name = BUILT_IN.get(name, (module_name, class_name))
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"tts.backend {name!r} cannot be loaded: {exc}") from None


def check_backend(config: Config) -> None:
    """Fail fast (ConfigError) on a backend that cannot run: missing model, unknown speakers."""
    name = config.tts.backend
    if name in BUILT_IN:
        check = importlib.import_module(BUILT_IN[name][0]).check
    else:
        check = getattr(backend_class(name), "check", None)
    if check is not None:
        check(config)
    check_gate(config.validate)  # the quality gate's recogniser runs in the same workers


def build_backend(config: Config) -> Backend:
    """Load the configured backend in this process."""
    return backend_class(config.tts.backend)(config)
