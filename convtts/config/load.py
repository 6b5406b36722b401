"""The whole config: its groups, read from YAML (a shipped one or a file, over its base), overridden, checked."""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from convtts.config.errors import ConfigError
from convtts.config.plan import SelectConfig, ShardConfig, SpeakerConfig, TextConfig
from convtts.config.run import OutputConfig, ValidateConfig, WorkerConfig
from convtts.config.voices import TTSConfig


@dataclass(frozen=True)
class Config:
    select: SelectConfig = field(default_factory=SelectConfig)
    text: TextConfig = field(default_factory=TextConfig)
    speakers: SpeakerConfig = field(default_factory=SpeakerConfig)
    shards: ShardConfig = field(default_factory=ShardConfig)
    tts: TTSConfig = field(default_factory=TTSConfig)
    workers: WorkerConfig = field(default_factory=WorkerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)

    def check(self) -> None:
        for group in dataclasses.fields(self):
            getattr(self, group.name).check()
        if self.speakers.pool and self.tts.backend == "piper":
            raise ConfigError(
                "speakers.pool holds prompt recordings for zero-shot voices: it needs tts.backend "
                "cosyvoice (Piper speaks only the voices of tts.piper.voices)"
            )
        if self.tts.backend == "piper":  # a custom backend's own check() says which voices it has
            check_piper_voices(self)


def check_piper_voices(config: Config) -> None:
    missing = [v for v in config.speakers.voices if v not in config.tts.piper.voices]
    if missing:
        raise ConfigError(
            f"speakers.voices {missing} are not defined in tts.piper.voices "
            f"(defined: {sorted(config.tts.piper.voices)})"
        )


# Groups that decide the plan; changing any of them makes an existing plan stale.
PLAN_GROUPS = ("select", "text", "speakers", "shards")


# The shipped configs: configs/ in a checkout, convtts/configs/ in an installed wheel (setup.py copies them).
SHIPPED_CONFIG_DIRS = (Path(__file__).parents[1] / "configs", Path(__file__).parents[2] / "configs")


def shipped_config(name: str) -> Path | None:
    """The shipped config of that name ('default', 'cosyvoice2'), or None."""
    for folder in SHIPPED_CONFIG_DIRS:
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    return None


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read a YAML file (or the defaults), apply `a.b=value` overrides, build and check.

    A bare name that is no file ('cosyvoice2') means the shipped config of that name. A file's
    `base:` names the config it changes (a path, relative to the file, or a shipped name): its
    groups are merged over the base's, key by key.
    """
    data = read_config(path, ()) if path is not None else {}
    for item in overrides:
        apply_override(data, item)
    config = build(Config, data, "")
    config.check()
    return config


def read_config(path: str | Path, seen: tuple[Path, ...]) -> dict:
    """A config file's data, merged over its base's (if it names one)."""
    if not Path(path).exists() and shipped_config(str(path)):
        path = shipped_config(str(path))
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of groups")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: base must name a config file or a shipped config, got {base!r}")
    here = Path(path).resolve()
    if here in seen:
        raise ConfigError(f"{path}: its bases come back to it ({' -> '.join(map(str, seen))})")
    relative = here.parent / base
    return merged(read_config(relative if relative.exists() else base, (*seen, here)), data)


def merged(base: dict, changes: dict) -> dict:
    """`changes` over `base`: mappings key by key, anything else (lists too) replaced."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def apply_override(data: dict, item: str) -> None:
    """`workers.per_slot=4` sets data['workers']['per_slot'] = 4 (the value read as YAML)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like group.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part} is not a group")
    node[parts[-1]] = value


def build(cls, data, where: str):
    """Build dataclass `cls` from plain data, rejecting unknown keys and wrong types by name."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(names)}"
            raise ConfigError(f"unknown config key {where + str(key)!r}{hint}")
    kwargs = {k: convert(hints[k], v, f"{where}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where.rstrip('.') or 'config'}: {exc}") from None


def convert(kind, value, where: str):
    """Coerce one YAML value to the annotated type, or say which key is wrong."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return None if value is None else convert(options[0], value, where)
    if dataclasses.is_dataclass(kind):
        return build(kind, value if value is not None else {}, where + ".")
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(convert(typing.get_args(kind)[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        inner = typing.get_args(kind)[1]
        return {str(k): convert(inner, v, f"{where}.{k}") for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if kind is int and not (isinstance(value, int) and not isinstance(value, bool)):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {value!r}")
    return value


def to_dict(config) -> dict:
    return dataclasses.asdict(config)


def dump_yaml(config: Config) -> str:
    return yaml.safe_dump(_plain(to_dict(config)), sort_keys=False, allow_unicode=True)


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    """python -m convtts.config NAME: print a shipped config (to copy and edit), or list them."""
    names = sorted({p.stem for folder in SHIPPED_CONFIG_DIRS for p in folder.glob("*.yaml")})
    args = sys.argv[1:] if argv is None else argv
    path = shipped_config(args[0]) if len(args) == 1 else None
    if path is None:
        print(f"usage: python -m convtts.config NAME > my.yaml  (NAME: {', '.join(names)})", file=sys.stderr)
        return 2
    sys.stdout.write(path.read_text())
    return 0
