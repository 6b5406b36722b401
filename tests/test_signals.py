"""run_all.sh stopped by a signal, and its exit codes: Ctrl-C on a terminal, SIGTERM under cron, a
kill -9 of run_all.sh alone; bad options and output folders; log folders of outputs of one name.

Real runs: the slots, workers and Piper voice on CPU; Ctrl-C is typed into a pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import subprocess
import termios
import threading
import time
from pathlib import Path

import orjson
import pytest

from conftest import (
    REPO,
    alive,
    assert_complete,
    llava_conversations,
    lock_free,
    run_all,
    script_env,
    spoken_so_far,
    wait_for,
    worker_pids,
    write_input,
)

pytestmark = pytest.mark.e2e

ARGS = ("--gpus", "cpu:2", "--set", "shards.segments_per_shard=8")
STOPPED_WITHIN = 10.0  # seconds from the signal to run_all.sh's exit


def command(source: Path, out: Path) -> list[str]:
    return ["bash", str(REPO / "run_all.sh"), "--input", str(source), "--output-dir", str(out), *ARGS]


def log_args(out: Path) -> list[str]:
    return ["--log-dir", str(out.parent / "log")]


class Terminal:
    """run_all.sh on a pseudo-terminal of its own, as typed in a shell: its output read as it comes."""

    def __init__(self, argv: list[str]):
        self.master, slave = pty.openpty()
        self.run = subprocess.Popen(
            argv,
            env=script_env(),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # the terminal becomes its own
        )
        os.close(slave)
        self.output = bytearray()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        """Drain the terminal, or the bars fill it and the run blocks on a write."""
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                return
            if not chunk:
                return
            self.output += chunk

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")  # the terminal sends SIGINT to its foreground process group

    def text(self) -> str:
        self.reader.join(timeout=5)
        return self.output.decode(errors="replace")


def started_speaking(out: Path) -> bool:
    return (out / "work").is_dir() and len(spoken_so_far(out)) >= 4


def stops_within(run: subprocess.Popen, seconds: float) -> float:
    began = time.monotonic()
    run.wait(timeout=seconds)
    return time.monotonic() - began


def rerun_completes(source: Path, out: Path) -> None:
    again = run_all("--input", source, "--output-dir", out, *ARGS, *log_args(out))
    assert again.returncode == 0, again.stderr
    assert_complete(out)  # every id once


def test_one_ctrl_c_on_a_terminal_stops_the_run_and_a_rerun_finishes(tmp_path, small_input):
    out = tmp_path / "out"
    terminal = Terminal([*command(small_input, out), *log_args(out)])
    try:
        wait_for(lambda: started_speaking(out))
        terminal.ctrl_c()
        took = stops_within(terminal.run, STOPPED_WITHIN)
    finally:
        terminal.run.kill()
    said = terminal.text()
    assert terminal.run.returncode == 130, said[-2000:]
    assert "INT received" in said and "run the same command again" in said, said[-2000:]
    assert took < STOPPED_WITHIN
    wait_for(lambda: not worker_pids(terminal.run.pid), timeout=5)  # the slots' workers stopped too
    rerun_completes(small_input, out)


def test_sigterm_without_a_terminal_stops_the_run_and_a_rerun_finishes(tmp_path, small_input):
    out = tmp_path / "out"
    run = subprocess.Popen(
        [*command(small_input, out), *log_args(out)],
        env=script_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_for(lambda: started_speaking(out))
        run.send_signal(signal.SIGTERM)  # to run_all.sh alone, as `kill PID` does
        _, stderr = run.communicate(timeout=STOPPED_WITHIN)
    finally:
        run.kill()
    assert run.returncode == 143, stderr.decode()
    assert "run the same command again" in stderr.decode()
    assert not worker_pids(run.pid) and lock_free(out)
    rerun_completes(small_input, out)


def test_kill_9_of_run_all_alone_stops_its_slots_and_frees_the_lock(tmp_path, small_input):
    out = tmp_path / "out"
    run = subprocess.Popen(
        [*command(small_input, out), *log_args(out)],
        env=script_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: started_speaking(out))
        workers = worker_pids(run.pid)
        assert workers, "no worker processes found"
        run.kill()  # SIGKILL to run_all.sh alone: no trap runs, its slots are orphaned
        run.wait()
        wait_for(lambda: lock_free(out), timeout=STOPPED_WITHIN)
        wait_for(lambda: not any(alive(pid) for pid in workers), timeout=5)
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)  # what is left of the run, should the test fail
        except ProcessLookupError:
            pass
    rerun_completes(small_input, out)


# -- exit codes of bad options and folders: 2, one line, no traceback ------------------------------------


def refused(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr and "line " not in result.stderr, result.stderr
    return lines[0]


def test_an_empty_gpu_list_is_refused_in_one_line(tmp_path, small_input):
    line = refused(run_all("--input", small_input, "--output-dir", tmp_path / "out", "--gpus", ""))
    assert "--gpus needs" in line and "--help" in line
    assert not (tmp_path / "out").exists()


def test_an_option_without_its_value_is_refused_in_one_line(tmp_path, small_input):
    line = refused(run_all("--input", small_input, "--log-dir", tmp_path / "log", "--output-dir"))
    assert "--output-dir needs a folder" in line


def test_an_output_folder_that_cannot_be_made_is_refused_in_one_line(tmp_path, small_input):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    line = refused(run_all("--input", small_input, "--output-dir", blocker / "out"))
    assert line.startswith("run_all.sh: cannot create the output folder") and "Not a directory" in line


def test_a_config_that_is_a_folder_is_refused_in_one_line(tmp_path, small_input):
    line = refused(run_all("--input", small_input, "--output-dir", tmp_path / "out", "--config", tmp_path))
    assert f"cannot read {tmp_path}: Is a directory" in line
    assert not (tmp_path / "out").exists()


def test_help_names_the_command_as_typed(tmp_path):
    typed = subprocess.run(
        [str(script_env()["PYTHON"]), "-m", "convtts", "--help"],
        env=script_env(),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert typed.returncode == 0 and typed.stdout.startswith("usage: python -m convtts --input"), typed.stdout
    script = subprocess.run(["bash", str(REPO / "run_all.sh"), "--help"], capture_output=True, text=True, timeout=60)
    assert script.stdout.startswith("usage: run_all.sh --input") and "130" in script.stdout


# -- logs ---------------------------------------------------------------------------------------------


def test_outputs_of_one_name_in_two_folders_keep_their_logs_apart(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(1))
    log = tmp_path / "log"
    folders = []
    for parent in ("a", "b"):
        out = tmp_path / "x" / parent / "out"
        result = run_all("--input", source, "--output-dir", out, "--gpus", "cpu:1", "--log-dir", log)
        assert result.returncode == 0, result.stderr
        folder = Path(orjson.loads((out / "summary.json").read_bytes())["this_run"]["log_dir"])
        assert folder.parent.parent == log and folder.parent.name.startswith("out-")
        for name in ("slot-0.log", "preprocess.log", "slot-0-worker-0.log"):
            first = (folder / name).read_text().splitlines()[0]
            assert f"output {out}, run {folder.name}" in first, (name, first)
        folders.append(folder.parent)
    assert folders[0] != folders[1]
    assert sorted(p.name for p in log.iterdir()) == sorted(f.name for f in folders)
