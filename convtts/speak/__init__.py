"""TTS backends behind one interface; `check_backend` runs before any worker, `build_backend` inside each.

`tts.backend` is `piper`, `cosyvoice`, `silence` (benchmarking: silence of the planned length), or
`package.module:Class` for a backend of your own: a class
taking the Config, with the Backend attributes and methods, and optionally a `check(config)` static
method that raises ConfigError before any worker starts. Such a class may name the languages it
speaks in a `languages` attribute (ISO 639-1 codes; without one it is taken to speak any).

`voice_languages` is what the plan asks: a lookup of data, with no voice code imported.
"""

from __future__ import annotations

import importlib
import json

from convtts.config import SHIPPED_CONFIG_DIRS, Config, ConfigError, load_config
from convtts.speak.base import Backend, SynthesisError

__all__ = [
    "Backend",
    "SynthesisError",
    "backend_row_mb",
    "backend_rows",
    "build_backend",
    "check_backend",
    "voice_languages",
    "with_rows",
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
    languages = getattr(backend_class(name), "languages", None)
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
