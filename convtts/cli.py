"""Shared command-line pieces for the entry scripts: config arguments and logging set-up."""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import logging
import os
import signal
import sys
from pathlib import Path

from convtts import EXIT_BAD_INPUT, EXIT_FAILURES
from convtts.config import Config, ConfigError, load_config
from convtts.state.layout import Layout


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: the built-in defaults, as in configs/default.yaml)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="GROUP.KEY=VALUE",
        help="override one config value, e.g. --set workers.per_slot=4 (repeatable)",
    )


def load_config_or_exit(args: argparse.Namespace, extra: list[str] = ()) -> Config:
    """Load and check the config; a bad one ends the process with exit code 2 and a plain message."""
    try:
        return load_config(args.config, [*args.overrides, *extra])
    except ConfigError as exc:
        fail(f"config error: {exc}")
    except OSError as exc:  # a folder, or a file this user cannot read: load_config names only a missing one
        fail(f"config error: cannot read {args.config}: {exc.strerror or exc}")


def planned_layout(output_dir: str) -> Layout:
    """The output directory's layout; ends the process if preprocessing has not planned it yet."""
    layout = Layout(output_dir)
    if not layout.plan_file.is_file():
        fail(f"no plan in {layout.plan_dir}: run preprocess.py (or run_all.sh) first")
    return layout


def fail(message: str, code: int = EXIT_BAD_INPUT):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def stop_with_parent(parent_pid: int, signum: int = signal.SIGTERM) -> None:
    """Have Linux send `signum` to this process when its parent dies, even by SIGKILL: a slot then
    stops its workers and lets go of the output's lock it inherited, so the run can start again.

    `parent_pid` (run_all.sh passes its own) catches a parent that died before the request was made.
    Only for children of a run: one started by hand from a shell (nohup) outlives the shell.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the slot still notices while it waits for the plan
        pass
    if os.getppid() != parent_pid:
        fail(f"the run that started this process (pid {parent_pid}) is gone", EXIT_FAILURES)


def setup_logging(log_file: str | Path | None = None, level: int = logging.INFO) -> None:
    """One log per process: a file when given, else stderr."""
    handler: logging.Handler
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(processName)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    dump_stacks_on_usr1(handler.stream)


def dump_stacks_on_usr1(stream) -> None:
    """`kill -USR1 PID` writes every thread's Python stack into this process's log, and the process goes
    on: where a stuck worker or slot is, even inside a call into C. Left alone where the stream has no
    file descriptor (a test's captured stderr)."""
    try:
        faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)
    except (AttributeError, OSError, ValueError):
        pass
