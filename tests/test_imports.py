"""The import graph, read from the source: no circles among convtts's modules, the stages in the order of
docs/ARCHITECTURE.md, no test module importing another. Every explicit import counts, those inside
functions too; the implicit import of a parent package does not, so a package that imports its own
submodules in __init__ is not a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `root`, by dotted name; a package is its __init__.py."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that module `name` imports, by name (a from-import of a submodule is that submodule)."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(filter(None, [here.rsplit(".", node.level - 1)[0] if node.level else "", node.module]))
            targets += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = set()
    for target in targets:
        while target and target not in known:  # `import a.b.c` of an attribute's module: the nearest module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A closed path (a, b, a) for every import that leads back to a module still being visited."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_convtts_has_no_import_circles():
    graph = import_graph(REPO, "convtts")
    assert len(graph) > 40 and "convtts.run.slot" in graph["convtts.run.command"]  # it read the real package
    assert circles(graph) == [], "\n".join(" -> ".join(circle) for circle in circles(graph))


# The stages in the order an utterance passes them (docs/ARCHITECTURE.md): a module may import its own
# stage and those after it. Above them all the node's job and the test models; below them all
# everything else (config, cli, state, errors, language, tuning, cuda_graphs, counts), which imports no stage.
STAGES = ("cluster", "plan", "run", "speak", "gate", "results")
ABOVE = ("node", "__main__", "testing")


def stage_of(module: str) -> str:
    """`run` for convtts.run.slot; `below` for a module of no stage."""
    part = module.split(".")[1] if "." in module else ""
    return part if part in STAGES or part in ABOVE else "below"


def upward(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import that runs against the stages' order."""
    found = []
    for module, targets in sorted(graph.items()):
        here = stage_of(module)
        for target in sorted(targets):
            there = stage_of(target)
            if here in ABOVE or there == "below" or here == there:
                continue
            if there in ABOVE or here == "below" or STAGES.index(there) < STAGES.index(here):
                found.append(f"{module} -> {target}")
    return found


def test_imports_follow_the_stages_order():
    graph = import_graph(REPO, "convtts")
    assert {stage_of(name) for name in graph} == {*STAGES, *ABOVE, "below"}  # every stage read
    assert upward(graph) == []


def test_the_order_check_finds_imports_back_up_the_flow():
    graph = {
        "convtts.run.slot": {
            "convtts.speak.base",
            "convtts.state.layout",
            "convtts.run.pieces",
            "convtts.gate.quality",
        },
        "convtts.speak.silence": {"convtts.plan.language", "convtts.language"},
        "convtts.gate.whisper": {"convtts.speak.engine"},
        "convtts.cluster.handout": {"convtts.run.pieces"},
        "convtts.node": {"convtts.plan.command", "convtts.results.merge"},
        "convtts.testing.model": {"convtts.speak.runtime"},
        "convtts.tuning": {"convtts.run.slot"},
        "convtts.results.merge": {"convtts.node", "convtts.state.shardio"},
        "convtts.plan.planner": {"convtts.testing.model"},
    }
    assert upward(graph) == [
        "convtts.gate.whisper -> convtts.speak.engine",
        "convtts.plan.planner -> convtts.testing.model",
        "convtts.results.merge -> convtts.node",
        "convtts.speak.silence -> convtts.plan.language",
        "convtts.tuning -> convtts.run.slot",
    ]


def test_the_check_finds_circles_through_functions_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    sources = {
        "__init__.py": "from pkg.a import f\n",  # a package importing its submodule: no circle
        "a.py": "import pkg.b\n\ndef f():\n    pass\n",
        "b.py": "def g():\n    from pkg import a  # inside a function, a submodule by from-import\n",
        "c.py": "from . import d\n",
        "d.py": "from .c import something\nimport os\n",
        "e.py": "from pkg import f\n",  # the package's __init__, which imports a, which is fine
    }
    for name, text in sources.items():
        (package / name).write_text(text)
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg"] == {"pkg.a"} and graph["pkg.e"] == {"pkg"} and graph["pkg.d"] == {"pkg.c"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.c", "pkg.d", "pkg.c"]]


def test_no_test_module_imports_another():
    """Helpers shared by test modules live in tests/conftest.py: importing a test module runs its
    collection-time code and ties the modules' fates together."""
    offenders = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            offenders += [f"{path.name}: {name}" for name in names if name.split(".")[0].startswith("test_")]
    assert offenders == []
