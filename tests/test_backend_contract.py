"""The run stage reads of a voice only what convtts/speak/base.py declares, and never names one.

Read two ways: in the source of run/, cluster/ and results/ (every attribute read of an object that
is a backend, and no probing with getattr or hasattr), and during a real run of the silence voice,
whose every member read from outside the voice is recorded (tests/strict_backend.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO, assert_complete, run_all, script_env
from convtts.speak import BUILT_IN
from convtts.speak.base import Backend, BatchedBackend

STAGES = ("run", "cluster", "results")  # the stages that drive a voice, or read what it wrote
PROBES = {"getattr", "hasattr", "setattr", "delattr"}


def declared() -> set[str]:
    """Every member Backend and BatchedBackend declare, with or without a default."""
    names = set()
    for cls in (Backend, BatchedBackend):
        names |= {n for n in vars(cls) if not n.startswith("_")} | set(cls.__annotations__)
    return names


def sources(stages=STAGES) -> dict[str, ast.Module]:
    paths = sorted(p for stage in stages for p in (REPO / "convtts" / stage).rglob("*.py"))
    return {str(p.relative_to(REPO)): ast.parse(p.read_bytes(), str(p)) for p in paths}


def is_backend(node: ast.expr) -> bool:
    """An expression that is a backend or its class: `backend`, `x.backend` (not the `tts.backend`
    or `settings.backend` that name one), `backend_class(...)`, `build_backend(...)`."""
    if isinstance(node, ast.Name):
        return node.id == "backend"
    if isinstance(node, ast.Attribute):
        owner = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
        return node.attr == "backend" and owner not in ("tts", "settings")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in ("backend_class", "build_backend")
    return False


def undeclared_reads(trees: dict[str, ast.Module]) -> list[str]:
    """`file:line name` for each read of a backend member the contract does not declare, and each probe."""
    found, names = [], declared()
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and is_backend(node.value) and node.attr not in names:
                found.append(f"{path}:{node.lineno} {node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in PROBES and node.args:
                if is_backend(node.args[0]):
                    found.append(f"{path}:{node.lineno} {node.func.id}")
    return sorted(found, key=by_place)


def names_of_voices(trees: dict[str, ast.Module]) -> list[str]:
    """`file:line what` wherever code (not a docstring, a comment or a sentence of a message) names a
    voice: a string that is a voice's name, a name or attribute made of one (`config.tts.cosyvoice`,
    `cosyvoice_root`), or an import of a voice's own modules (anything in convtts.speak but its
    package and base)."""
    voices = set(BUILT_IN)
    found = []

    def named(word: str) -> bool:
        return bool(voices & set(word.lower().split("_")))

    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in voices:
                found.append(f"{path}:{node.lineno} {node.value!r}")
            elif isinstance(node, ast.Attribute) and named(node.attr):
                found.append(f"{path}:{node.lineno} .{node.attr}")
            elif isinstance(node, (ast.Name, ast.arg)) and named(getattr(node, "id", None) or node.arg):
                found.append(f"{path}:{node.lineno} {getattr(node, 'id', None) or node.arg}")
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and named(node.name):
                found.append(f"{path}:{node.lineno} {node.name}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [f"{path}:{node.lineno} import {m}" for m in imported(node) if voice_module(m)][:1]
    return sorted(found, key=by_place)


def by_place(entry: str) -> tuple[str, int]:
    path, line = entry.split()[0].rsplit(":", 1)
    return path, int(line)


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement reads: `from a import b` reads a and, should b be a module, a.b."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]


def voice_module(dotted: str) -> bool:
    """A module of a voice's own: anything in convtts/speak/ but its package and base.py."""
    parts = dotted.split(".")
    own = {p.stem for p in (REPO / "convtts" / "speak").iterdir() if p.stem not in ("__init__", "base", "__pycache__")}
    return parts[:2] == ["convtts", "speak"] and len(parts) > 2 and parts[2] in own


def test_the_run_stage_reads_only_what_the_contract_declares():
    trees = sources()
    assert len(trees) > 15 and "convtts/run/batching.py" in trees  # it read the real stages
    assert undeclared_reads(trees) == []


def test_no_module_of_the_run_stage_names_a_voice():
    assert names_of_voices(sources()) == []


def test_the_checks_find_what_they_look_for():
    """Each kind of read and name the two checks refuse, in code; the same words in a docstring or a
    message pass."""
    code = '''
def f(ctx, backend, config):
    """A cosyvoice worker's batch_size: getattr(backend, "rows")."""
    ctx.backend.synthesize("a", "b", 1)  # declared
    backend.rows_with_room  # not declared
    hasattr(ctx.backend, "sample_rate")  # a probe, even of a declared name
    config.tts.backend.upper()  # the name of a voice, not a voice
    log.info("the cosyvoice runtime took %d s", 3)
    if config.tts.backend == "piper":
        return config.tts.cosyvoice.batch_size
    from convtts.speak.silence import silence_samples
    from convtts.speak import backend_class
    from convtts.speak.base import Backend
    return backend_class(config.tts.backend).weight_files(config)
'''
    trees = {"x.py": ast.parse(code)}
    assert undeclared_reads(trees) == ["x.py:5 rows_with_room", "x.py:6 hasattr", "x.py:14 weight_files"]
    assert names_of_voices(trees) == ["x.py:9 'piper'", "x.py:10 .cosyvoice", "x.py:11 import convtts.speak.silence"]


def touched_members(folder: Path) -> dict[str, set[str]]:
    """Every member of the voice read from outside it during the run, by name: the modules that read it."""
    found: dict[str, set[str]] = {}
    for path in folder.glob("*.txt"):
        for line in path.read_text().splitlines():
            module, name = line.split()
            found.setdefault(name, set()).add(module)
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("voice", ["StrictSilence", "StrictBatchedSilence"])
def test_a_real_run_reads_only_declared_members_of_its_voice(tmp_path, small_input, voice):
    """A whole run (plan, slot, two workers, merge) of the silence voice, batched too, with an
    out-of-memory in each worker's first batch: every member of it read from outside is declared."""
    touched = tmp_path / "touched"
    touched.mkdir()
    out = tmp_path / "out"
    env = script_env(CONVTTS_TEST_TOUCHED=touched, CONVTTS_TEST_OOM_ONCE=1)
    backend = ("--set", f"tts.backend=strict_backend:{voice}", "--set", "shards.segments_per_shard=8")
    result = run_all("--input", small_input, "--output-dir", out, "--gpus", "cpu:1", *backend, env=env)
    assert result.returncode == 0, result.stderr
    assert len(assert_complete(out)) > 40
    seen = touched_members(touched)
    assert {"check", "resources", "name", "sample_rate", "synthesize", "load_phases", "weights_digest"} <= set(seen), (
        seen
    )
    if voice == "StrictBatchedSilence":
        assert {"synthesize_many", "shrink_batch", "grow_batch", "batch_rows"} <= set(seen), seen
    assert {name: seen[name] for name in set(seen) - declared()} == {}
