"""configs/default.yaml documents every key the config loader accepts, each with its comment, and no key it
does not know; its values are the loader's own defaults, so reading it changes nothing."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

from convtts.config import Config, load_config

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = REPO / "configs" / "default.yaml"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def loader_keys(cls=Config, prefix: str = "") -> list[str]:
    """Every key the loader builds, dotted; a mapping the user fills (voices, prompts) is one key."""
    hints = typing.get_type_hints(cls)
    keys = []
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind):
            keys += loader_keys(kind, f"{prefix}{field.name}.")
        else:
            keys.append(prefix + field.name)
    return keys


def documented_keys(text: str, leaves: set[str]) -> dict[str, bool]:
    """Each dotted key the YAML text names, and whether its line carries a comment. Lines under a key of
    `leaves` (a mapping's own entries) and comment lines are not keys."""
    found: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([key for _, key in stack] + [match["key"]])
        if not any(path.startswith(leaf + ".") for leaf in leaves):
            found[path] = "#" in match["rest"]
        stack.append((indent, match["key"]))
    return {path: commented for path, commented in found.items() if not is_group(path, found)}


def is_group(path: str, found: dict[str, bool]) -> bool:
    return any(other.startswith(path + ".") for other in found)


def gaps(text: str) -> tuple[list[str], list[str], list[str]]:
    """Keys the loader accepts that the text leaves out, keys it names that the loader does not know, and
    documented keys without a comment."""
    accepted = loader_keys()
    documented = documented_keys(text, set(accepted))
    missing = [key for key in accepted if key not in documented]
    unknown = [key for key in documented if key not in accepted]
    bare = [key for key, commented in documented.items() if key in accepted and not commented]
    return missing, unknown, bare


def test_default_yaml_documents_every_key_the_loader_accepts():
    missing, unknown, bare = gaps(DEFAULTS.read_text(encoding="utf-8"))
    assert not missing, f"configs/default.yaml leaves out keys the loader accepts: {missing}"
    assert not unknown, f"configs/default.yaml documents keys the loader does not know: {unknown}"
    assert not bare, f"configs/default.yaml keys without their comment: {bare}"


def test_default_yaml_holds_the_loaders_own_defaults():
    assert load_config(DEFAULTS) == load_config(None)


def test_the_check_catches_a_missing_an_unknown_and_a_bare_key():
    text = DEFAULTS.read_text(encoding="utf-8")
    without = re.sub(r"(?m)^  cuda_sync:.*\n", "", text)
    assert gaps(without)[0] == ["workers.cuda_sync"]
    extra = text.replace("\nworkers:\n", "\nworkers:\n  per_gpu: 2  # no such key\n", 1)
    assert gaps(extra)[1] == ["workers.per_gpu"]
    bare = re.sub(r"(?m)^(  rows_per_gpu: 0) *#.*$", r"\1", text)
    assert gaps(bare)[2] == ["workers.rows_per_gpu"]
    assert "tts.piper.voices" in documented_keys(text, set(loader_keys()))  # a mapping is one key
