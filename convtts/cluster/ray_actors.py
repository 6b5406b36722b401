"""What the Ray engine runs on each node: a slot (parallel_cosyvoice.py --feed) and the node's MPS daemon.

Both are plain classes; convtts.cluster.ray_engine makes them Ray actors. They run in Ray's worker
processes, so they use the node's own Python and its own copy of the repository.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # convtts/
MPS_SCRIPT = PACKAGE / "run" / "mps.sh"


class SlotProcess:
    """One slot on this node: the same slot that run_all.sh starts (python -m convtts.run), its shards
    handed out by the driver over the slot's stdin and stdout (convtts.run.feed)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def where(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def start(self, args: list[str], env: dict, log_file: str) -> tuple[int, str, str]:
        """Start the slot; its output goes to its own log file. Returns its pid, this host's name and
        the GPU Ray gave it (CUDA_VISIBLE_DEVICES, set by Ray in this actor's environment)."""
        command = [sys.executable, "-m", "convtts.run", "--feed", *args]
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "ab") as log:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=slot_env(env),
                text=True,
                bufsize=1,
                preexec_fn=_die_with_parent,
            )
        return self.proc.pid, socket.gethostname(), os.environ.get("CUDA_VISIBLE_DEVICES", "")

    def exchange(self, answer: str | None) -> tuple:
        """Give the slot the driver's answer (if any), then wait for its next line: ("next", rows, worker_rows),
        ("done", shard), or ("exit", code) once it has ended."""
        if answer is not None:
            try:
                self.proc.stdin.write(answer + "\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass  # it died: the read below says how
        line = self.proc.stdout.readline()
        if not line:
            return ("exit", self.proc.wait())
        return tuple(line.split())


class NodeMPS:
    """This node's one MPS control daemon, shared by the node's slots: started and stopped by
    convtts/run/mps.sh, as run_all.sh does on one node."""

    def __init__(self):
        self.env: dict = {}
        self.temporary = ""  # the short pipe folder mps.sh made in /tmp for a long log path; removed at stop

    def start(self, mode: str, folder: str) -> tuple[dict, str]:
        """Returns the variables the node's slots need to reach the daemon ({} without MPS), and
        what mps.sh said."""
        script = (
            'source "$0"; mps_start "$1" "$2"; '
            "if ((${#MPS_PIPES[@]})); then "
            'echo "$CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY ${MPS_TEMP_PIPES[0]:-}"; fi'
        )
        done = subprocess.run(
            ["bash", "-c", script, str(MPS_SCRIPT), mode, folder], capture_output=True, text=True, timeout=120
        )
        fields = done.stdout.split()
        if len(fields) in (2, 3):
            self.env = {"CUDA_MPS_PIPE_DIRECTORY": fields[0], "CUDA_MPS_LOG_DIRECTORY": fields[1]}
            self.temporary = fields[2] if len(fields) == 3 else ""
        return self.env, f"{socket.gethostname()}: {done.stderr.strip() or ('MPS started' if self.env else 'no MPS')}"

    def stop(self) -> None:
        """mps.sh's own mps_stop, as run_all.sh's: the daemon told to quit, the short pipe folder removed."""
        if self.env:
            script = 'source "$0"; MPS_PIPES=("$CUDA_MPS_PIPE_DIRECTORY"); MPS_TEMP_PIPES=($1); mps_stop'
            subprocess.run(
                ["bash", "-c", script, str(MPS_SCRIPT), self.temporary],
                env={**os.environ, **self.env},
                capture_output=True,
                timeout=60,
            )
            self.env, self.temporary = {}, ""


def slot_env(extra: dict) -> dict:
    """This process's environment and `extra`, with this convtts package first on the slot's path."""
    paths = [str(PACKAGE.parent), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def _die_with_parent() -> None:
    """In the slot, before exec: Linux kills it when the actor's process ends (a lost node, a killed
    driver), and its workers die with it (worker.py asks the same of the slot)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
