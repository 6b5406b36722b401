"""What changed since a plan was made: the plan version, the input and each plan setting, for a refusal to name."""

from __future__ import annotations

from pathlib import Path

import orjson

from convtts.config import Config, ConfigError, load_config
from convtts.plan.freshness import PLAN_VERSION, content_digest, input_info, plan_settings, rules_digest
from convtts.state.layout import Layout
from convtts.state.shardio import read_json


def plan_changes(input_path: str | Path, layout: Layout, config: Config) -> list[str]:
    """What a plan made now from this input and config would change in the one in `layout`: the
    plan version, the input, and each plan setting as 'text.max_words: 30 -> 12'.

    A plan made before plan.json kept its settings is compared with the output's config.yaml, the
    config of the preprocess that made it."""
    plan = read_json(layout.plan_file)
    if not isinstance(plan, dict):
        return [f"{layout.plan_file} is missing or unreadable"]
    changes = []
    if plan.get("version") != PLAN_VERSION:
        changes.append(f"plan version: {plan.get('version')} -> {PLAN_VERSION} (the plan's files)")
    made_by = plan.get("rules")
    if isinstance(made_by, str) and made_by != rules_digest(config):
        changes.append(f"text rules: {made_by} -> {rules_digest(config)} (what cleaning and splitting say)")
    changes += _input_changes(input_path, plan.get("input") or {})
    old = plan.get("settings") or _settings_in(layout.config_file)
    if old is not None:
        before, now = _flat(old), _flat(orjson.loads(orjson.dumps(plan_settings(config))))  # tuples as lists
        for key in sorted(before.keys() | now.keys()):
            if before.get(key, _UNSET) != now.get(key, _UNSET):
                changes.append(f"{key}: {_shown(before.get(key, _UNSET))} -> {_shown(now.get(key, _UNSET))}")
    return changes


_UNSET = object()


def _shown(value) -> str:
    return "(not set)" if value is _UNSET else orjson.dumps(value).decode()


def _flat(settings: dict, prefix: str = "") -> dict:
    """{'text.max_words': 30, ...}: a nested group's keys joined by dots."""
    flat = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _input_changes(input_path: str | Path, old: dict) -> list[str]:
    now = input_info(input_path)
    if "sha256" in old:
        digest = content_digest(input_path)
        if digest == old["sha256"]:
            return []
        return [f"the input's content: sha256 {old['sha256'][:12]}... -> {digest[:12]}... ({now['path']})"]
    if (old.get("path"), old.get("size"), old.get("mtime_ns")) != (now["path"], now["size"], now["mtime_ns"]):
        return [f"the input: {old.get('path')} of {old.get('size')} bytes -> {now['path']} of {now['size']} bytes"]
    return []


def _settings_in(config_file: Path) -> dict | None:
    try:
        return orjson.loads(orjson.dumps(plan_settings(load_config(config_file)))) if config_file.is_file() else None
    except (ConfigError, OSError):
        return None
