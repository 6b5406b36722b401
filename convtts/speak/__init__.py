"""TTS backends behind one interface; `check_backend` runs before any worker, `build_backend` inside each.

`tts.backend` is `piper`, `cosyvoice`, `silence` (benchmarking: silence of the planned length), or
`package.module:Class` for a backend of your own: a class
taking the Config, with the Backend attributes and methods, and optionally a `check(config)` static
method that raises ConfigError before any worker starts.
"""

from __future__ import annotations

import importlib

from convtts.config import Config, ConfigError
from convtts.speak.base import Backend, SynthesisError

__all__ = ["Backend", "SynthesisError", "backend_row_mb", "backend_rows", "build_backend", "check_backend", "with_rows"]

BUILT_IN = {
    "piper": ("convtts.speak.piper", "PiperBackend"),
    "cosyvoice": ("convtts.speak.cosyvoice.backend", "CosyVoiceBackend"),
    "silence": ("convtts.speak.silence", "SilenceBackend"),
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


def build_backend(config: Config) -> Backend:
    """Load the configured backend in this process."""
    return backend_class(config.tts.backend)(config)


def _backend_figure(config: Config, name: str):
    """The backend class's sizing method `name` (rows, row_gpu_mb, passes); None if it has none or is unknown."""
    if config.tts.backend not in BUILT_IN and ":" not in config.tts.backend:
        return None
    return getattr(backend_class(config.tts.backend), name, None)


def backend_rows(config: Config) -> int:
    """Utterances one worker of this backend speaks at once (a batched backend's `rows(config)`), else 1."""
    rows = _backend_figure(config, "rows")
    return int(rows(config)) if rows is not None else 1


def backend_rows_with_room(config: Config) -> int:
    """Rows a batched worker takes where the GPU's memory holds them (its backend's `rows_with_room`), else 0."""
    rows = _backend_figure(config, "rows_with_room")
    return int(rows(config)) if rows is not None else 0


def backend_row_mb(config: Config) -> float:
    """GPU MiB each batch row of a worker takes (a batched backend's `row_gpu_mb(config)`), else 0."""
    figure = _backend_figure(config, "row_gpu_mb")
    return float(figure(config)) if figure is not None else 0.0


def backend_passes(config: Config) -> tuple[float, int] | None:
    """(GPU MiB each row holds, MiB one pass may take) for a batched backend that sizes its passes, else None."""
    figures = _backend_figure(config, "passes")
    return figures(config) if figures is not None else None


def with_pass_mb(config: Config, mb: int) -> Config:
    """The config with a batched backend's pass budget set (its `with_pass_mb(config, mb)`)."""
    return backend_class(config.tts.backend).with_pass_mb(config, mb)


def with_rows(config: Config, rows: int) -> Config:
    """The config with a batched backend's rows set (its `with_rows(config, rows)`); unchanged for others."""
    setter = getattr(backend_class(config.tts.backend), "with_rows", None)
    return setter(config, rows) if setter is not None else config
