"""The node job, `python -m convtts` (run_all.sh calls it): plan, one slot per GPU, wait, merge.

The orchestration itself is node.sh beside this file, a strict bash script (locks, waits on every
slot, traps); this module starts it in place of the Python process, with PYTHON set to this
interpreter so that every step runs with the same installation.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("node.sh")


def command_name(argv0: str) -> str:
    """The command as typed, for --help and messages: 'python -m convtts', or the script's name ('convtts')."""
    path = Path(argv0)
    if path.name == "__main__.py":
        return f"python -m {path.parent.name}"
    return f"python -m convtts.{path.stem}" if path.suffix == ".py" else path.name


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["check-model"]:  # the engine against upstream's path on a model: its own command
        from convtts.speak.cosyvoice.check import main as check_model

        sys.exit(check_model(args[1:]))
    env = {**os.environ, "PYTHON": sys.executable}
    env.setdefault("CONVTTS_PROG", command_name(sys.argv[0]))  # run_all.sh sets its own name
    env.setdefault("CONVTTS_HOME", os.getcwd())
    # exec, not a child: the same pid, so signals sent to the caller reach the orchestrator's traps
    os.execvpe("bash", ["bash", str(SCRIPT), *args], env)


if __name__ == "__main__":
    main()
