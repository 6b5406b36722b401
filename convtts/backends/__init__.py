"""TTS backends behind one interface; `check_backend` runs before any worker, `build_backend` inside each."""
from __future__ import annotations

from convtts.backends.base import Backend, SynthesisError
from convtts.config import Config

__all__ = ["Backend", "SynthesisError", "build_backend", "check_backend"]


def check_backend(config: Config) -> None:
    """Fail fast (ConfigError) on a backend that cannot run: missing model, unknown speakers."""
    if config.tts.backend == "piper":
        from convtts.backends.piper import check
    else:
        from convtts.backends.cosyvoice import check
    check(config)


def build_backend(config: Config) -> Backend:
    """Load the configured backend in this process."""
    if config.tts.backend == "piper":
        from convtts.backends.piper import PiperBackend as cls
    else:
        from convtts.backends.cosyvoice import CosyVoiceBackend as cls
    return cls(config)
