"""Every --flag an error or log message names is a flag of the command that prints it.

A message tells the user what to type next; a flag the command does not know (preprocess.py's
--force named by a refusal that run_all.sh relays, where the flag is --force-replan) is a dead end.
Messages are the string arguments of fail(), print(), logger calls and raised exceptions in
convtts/, and the echo, bad_usage and ${2:?...} lines of convtts/node.sh; each command's flags come
from its own --help (argparse) or from node.sh's option list.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from conftest import REPO, script_env

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
LOG_CALLS = {"debug", "info", "warning", "error", "exception", "critical"}
# Flags of other programs that messages tell the user to run, by a phrase the message holds.
OTHER_PROGRAMS = {"ray start": {"--head"}, "git submodule update": {"--init"}, "clone with": {"--recursive"}}
OTHER_PROGRAMS["pip install"] = {"--no-deps"}

HELP = {
    "preprocess.py": [str(REPO / "preprocess.py")],
    "parallel_cosyvoice.py": [str(REPO / "parallel_cosyvoice.py")],
    "export.py": [str(REPO / "export.py")],
    "merge": ["-m", "convtts.results.merge"],
    "cosyvoice_model": ["-m", "convtts.testing.cosyvoice_model"],
    "check-model": ["-m", "convtts.speak.cosyvoice.check"],
}
# Which commands print a module's messages, first match by path: run_all.sh relays the errors of
# preprocess, the slots, the Ray driver and merge (their logs are under its log folder).
PRINTED_BY = [
    ("convtts/plan/", {"preprocess.py", "run_all.sh"}),
    ("convtts/run/", {"parallel_cosyvoice.py", "run_all.sh"}),
    ("convtts/cluster/", {"run_all.sh"}),  # the Ray driver is started by run_all.sh alone
    ("convtts/results/export/", {"export.py"}),
    ("convtts/results/", {"merge", "run_all.sh"}),
    ("convtts/testing/cosyvoice_model.py", {"cosyvoice_model"}),
    ("convtts/speak/cosyvoice/check.py", {"check-model"}),
    ("convtts/tuning.py", {"parallel_cosyvoice.py", "run_all.sh"}),  # a slot sizing its workers
    ("convtts/", {"preprocess.py", "parallel_cosyvoice.py", "run_all.sh"}),  # config, gate, voices, state
]


def argparse_flags(args: list[str]) -> set[str]:
    """The flags of an argparse command, from its --help's option lines (`  --a, --b VALUE  text`)."""
    shown = subprocess.run(
        [sys.executable, *args, "--help"], env=script_env(), capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    options = re.findall(r"^  (-.*?)(?:  |$)", shown.stdout, re.M)
    return {flag for line in options for flag in FLAG.findall(line)}


def node_sh_flags(text: str) -> set[str]:
    """node.sh's option list: the patterns of its `case` over the arguments, e.g. `--fraction|--count)`."""
    return {flag for pattern in re.findall(r"^\s+(-[-\w|]+)\)", text, re.M) for flag in FLAG.findall(pattern)}


@pytest.fixture(scope="module")
def commands() -> dict[str, set[str]]:
    known = {name: argparse_flags(args) for name, args in HELP.items()}
    known["run_all.sh"] = node_sh_flags((REPO / "convtts" / "node.sh").read_text())
    return known


def python_messages():
    """(file, line, text) of each message in convtts/: the string parts of its arguments."""
    for path in sorted((REPO / "convtts").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else node
            if isinstance(call, ast.Call) and (isinstance(node, ast.Raise) or is_message_call(call)):
                parts = [*call.args, *(k.value for k in call.keywords)]
                text = "\0".join(n.value for a in parts for n in ast.walk(a) if is_text(n))
                yield path.relative_to(REPO).as_posix(), call.lineno, text


def is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def is_message_call(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in ("fail", "print")
    return isinstance(func, ast.Attribute) and func.attr in LOG_CALLS


def node_sh_messages():
    for number, line in enumerate((REPO / "convtts" / "node.sh").read_text().splitlines(), 1):
        if re.search(r"\becho\b|\bbad_usage\b|:\?", line):
            yield "convtts/node.sh", number, line


def named_flags(text: str) -> set[str]:
    flags = set(FLAG.findall(text))
    for program, theirs in OTHER_PROGRAMS.items():
        if program in text:
            flags -= theirs
    return flags


def printers(path: str) -> set[str]:
    if path == "convtts/node.sh":
        return {"run_all.sh"}
    return next(names for prefix, names in PRINTED_BY if path.startswith(prefix))


def test_every_flag_a_message_names_is_one_of_its_commands(commands):
    wrong, checked = [], set()
    for path, line, text in [*python_messages(), *node_sh_messages()]:
        for flag in named_flags(text):
            checked.add((path, flag))
            unknown = [name for name in printers(path) if flag not in commands[name]]
            wrong += [f"{path}:{line} names {flag}, unknown to {name}" for name in unknown]
    assert not wrong, "\n".join(wrong)
    # the collection sees the messages it is for: the refusal that run_all.sh relays from preprocess
    assert ("convtts/plan/command.py", "--force-replan") in checked and ("convtts/node.sh", "--gpus") in checked
    assert len(checked) > 20


def test_option_lists_are_read_whole(commands):
    assert {"--input", "--force-replan", "--gpus", "--set", "--slurm", "--help"} <= commands["run_all.sh"]
    assert {"--input", "--force", "--force-replan", "--validate", "--config", "--set"} <= commands["preprocess.py"]
    assert "--force" not in commands["run_all.sh"]
