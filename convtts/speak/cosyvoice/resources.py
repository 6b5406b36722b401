"""What a slot needs of a CosyVoice worker before any loads (Backend.resources), and the config it
gives its workers once it has sized them (Backend.sized)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from convtts.config import Config, ConfigError, CosyVoiceConfig
from convtts.speak.base import Preload, Resources

PRELOAD = f"{__name__}:preload"


def resources(config: Config, device: str) -> Resources:
    """Rows as tts.cosyvoice.batch_size says (0: the slot picks them); a row's memory: its static KV
    cache at the LLM's precision, all run long, and its share of the flow's work; on a GPU, passes
    of at most tts.cosyvoice.flow.max_mb. Workers are forked from a server that imported the runtime."""
    from convtts.speak.cosyvoice.row_memory import FLOW_MB_PER_ROW, row_kv_mb

    cosy = config.tts.cosyvoice
    kv_mb = row_kv_mb(config)
    return Resources(
        rows=cosy.batch_size,
        rows_with_room=cosy.batch_size_with_room,
        row_mb=kv_mb + FLOW_MB_PER_ROW,
        row_held_mb=kv_mb,
        pass_mb=cosy.flow.max_mb if device == "cuda" else 0,
        weights=tuple(weight_files(config)),
        start_method="forkserver",
        preload=Preload(
            PRELOAD,
            {
                "runtime_root": cosy.runtime_root,
                "version": _version(cosy.model_dir),
                "model_dir": cosy.model_dir,
                "standins": cosy.standins,
            },
        ),
    )


def weight_files(config: Config) -> list[Path]:
    """The checkpoints a load maps: what the slot reads into the page cache for its workers."""
    model_dir = Path(config.tts.cosyvoice.model_dir)
    files = [model_dir / name for name in ("llm.pt", "flow.pt", "hift.pt")]
    files += sorted((model_dir / "CosyVoice-BlankEN").glob("*.safetensors"))
    return [path for path in files if path.is_file()]


def sized(config: Config, rows: int, pass_mb: int = 0) -> Config:
    """The config with tts.cosyvoice.batch_size set to `rows` and, unless 0, flow.max_mb to `pass_mb`."""
    cosy = config.tts.cosyvoice
    flow = dataclasses.replace(cosy.flow, max_mb=pass_mb) if pass_mb else cosy.flow
    cosy = dataclasses.replace(cosy, batch_size=rows, flow=flow)
    return dataclasses.replace(config, tts=dataclasses.replace(config.tts, cosyvoice=cosy))


def preload(args: dict, phase) -> None:
    """In a slot's forkserver: the runtime and the modules the model's yaml names (runtime.import_model_modules),
    and transformers for v2/v3, which use it (v1 does not: speak.cosyvoice.standins)."""
    from convtts.speak.cosyvoice.runtime import import_model_modules, import_runtime

    version, standins = args.get("version"), args.get("standins", True)
    if (version or 0) >= 2:
        with phase("transformers"):
            import transformers  # noqa: F401
    with phase("runtime"):
        import_runtime(CosyVoiceConfig(runtime_root=args.get("runtime_root", ""), standins=standins), version)
    if version:
        with phase("model modules"):
            import_model_modules(args["model_dir"], version, standins)


def _version(model_dir: str) -> int | None:
    from convtts.speak.cosyvoice.runtime import model_version

    try:
        return model_version(model_dir)
    except ConfigError:
        return None  # the worker's own load says what is wrong
