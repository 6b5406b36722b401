"""run_all.sh as a process owner: MPS started and stopped on every exit path, SIGTERM stops only its own children.

A stand-in nvidia-cuda-mps-control on PATH records what run_all.sh asks of it (no GPU here); the
slots, workers and Piper voice are the real ones.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (
    REPO,
    alive,
    assert_complete,
    llava_conversations,
    mps_requests,
    run_all,
    script_env,
    spoken_so_far,
    wait_for,
    worker_pids,
    write_fake_mps,
    write_input,
)

pytestmark = pytest.mark.e2e


# Lists the GPUs of MPS_TEST_GPUS (default one, index 0) as `nvidia-smi --query-gpu=index` does;
# any other query fails, as on a machine whose driver is gone.
FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index*) for gpu in ${MPS_TEST_GPUS-0}; do echo "$gpu"; done ;;
  *) exit 9 ;;
esac
"""


def with_fake_smi(bin_dir: Path, env: dict) -> dict:
    """`env` with bin_dir first on PATH, holding the stand-in nvidia-smi."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return dict(env, PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")


@pytest.fixture
def mps_env(tmp_path):
    bin_dir = tmp_path / "bin"
    write_fake_mps(bin_dir)
    record = tmp_path / "mps.log"
    env = with_fake_smi(bin_dir, script_env(MPS_TEST_LOG=record))  # run_all.sh checks --gpus 0 against it
    return env, record


def test_gpus_the_machine_lacks_exit_2_before_anything_is_written(tmp_path, small_input):
    out = tmp_path / "out"
    none = run_all("--input", small_input, "--output-dir", out, "--gpus", "3")  # this machine: no nvidia-smi
    assert none.returncode == 2 and "--gpus 3: this machine has no nvidia-smi" in none.stderr, none.stderr
    two = dict(with_fake_smi(tmp_path / "bin", script_env()), MPS_TEST_GPUS="0 1")
    missing = run_all("--input", small_input, "--output-dir", out, "--gpus", "0,3", env=two)
    assert missing.returncode == 2, missing.stderr
    assert "--gpus 0,3: this machine has no GPU 3; nvidia-smi lists 0,1" in missing.stderr
    empty = run_all("--input", small_input, "--output-dir", out, "--gpus", "0", env=dict(two, MPS_TEST_GPUS=""))
    assert empty.returncode == 2 and "nvidia-smi lists no GPU" in empty.stderr, empty.stderr
    assert not out.exists()


def test_mps_starts_before_the_slots_and_stops_after_success(tmp_path, small_input, mps_env):
    env, record = mps_env
    log = tmp_path / "log"
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "0",
        "--workers",
        "2",
        "--log-dir",
        log,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert mps_requests(record) == ["start", "get_server_list", "quit"]
    start = record.read_text().splitlines()[0]
    run_dir = next(log.rglob("slot-0.log")).parent
    assert f"log={run_dir}/mps/log" in start  # private folders under the run's log folder
    assert_complete(tmp_path / "out")


def test_mps_per_gpu_starts_a_daemon_for_each_gpu_and_each_slot_reaches_its_own(tmp_path, small_input, mps_env):
    env, record = mps_env
    log = tmp_path / "log"
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "0,1",
        "--workers",
        "1",
        "--mps",
        "per-gpu",
        "--log-dir",
        log,
        env=dict(env, MPS_TEST_GPUS="0 1"),
    )
    assert result.returncode == 0, result.stderr
    run_dir = next(log.rglob("slot-0.log")).parent
    lines = record.read_text().splitlines()
    starts = [dict(field.split("=", 1) for field in line.split()[1:]) for line in lines if line.startswith("start ")]
    assert [(start["log"], start["visible"]) for start in starts] == [
        (f"{run_dir}/mps/log-{gpu}", str(gpu)) for gpu in (0, 1)
    ]
    pipes = [start["pipe"] for start in starts]  # under this deep tmp_path: short folders in /tmp, one a GPU
    assert len(set(pipes)) == 2 and all(pipe.startswith("/tmp/convtts-mps.") for pipe in pipes), pipes
    quits = sorted(line for line in lines if line.startswith("quit "))
    assert quits == sorted(f"quit pipe={pipe} there=yes" for pipe in pipes)
    assert not any(Path(pipe).exists() for pipe in pipes)
    for rank in (0, 1):
        slot_log = (run_dir / f"slot-{rank}.log").read_text()
        assert f"slot {rank}: GPU {rank}, the MPS daemon of {pipes[rank]}" in slot_log, slot_log
    assert_complete(tmp_path / "out")


def test_mps_per_gpu_that_fails_on_one_gpu_stops_the_others_and_runs_without_mps(tmp_path, small_input, mps_env):
    """GPU 1's daemon does not start: GPU 0's, already up, is told to quit through its pipe folder (a short
    one in /tmp under this deep tmp_path) before that folder is removed, and every slot runs without MPS."""
    env, record = mps_env
    log = tmp_path / "log"
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "0,1",
        "--workers",
        "1",
        "--mps",
        "per-gpu",
        "--log-dir",
        log,
        env=dict(env, MPS_TEST_GPUS="0 1", MPS_TEST_FAIL_VISIBLE="1"),
    )
    assert result.returncode == 0, result.stderr
    assert "--mps per-gpu was asked for; continuing without it" in result.stderr
    lines = record.read_text().splitlines()
    first = dict(field.split("=", 1) for field in lines[0].split()[1:])
    assert first["visible"] == "0"
    assert [line for line in lines if line.startswith("quit ")] == [f"quit pipe={first['pipe']} there=yes"]
    assert not any(Path(line.split()[1].removeprefix("pipe=")).exists() for line in lines)
    run_dir = next(log.rglob("slot-0.log")).parent
    for rank in (0, 1):
        assert f"slot {rank}: GPU {rank}, no MPS daemon" in (run_dir / f"slot-{rank}.log").read_text()
    assert_complete(tmp_path / "out")


def test_mps_per_gpu_is_refused_with_the_ray_engine(tmp_path, small_input):
    refused = run_all("--input", small_input, "--output-dir", tmp_path / "out", "--engine", "ray", "--mps", "per-gpu")
    assert refused.returncode == 2 and "--mps per-gpu is for run_all.sh's own slots" in refused.stderr


def test_a_long_log_path_gets_a_short_mps_pipe_folder_removed_after_the_run(tmp_path, small_input, mps_env):
    """A unix socket's path must be short: under a deep log folder MPS gets a folder of its own in
    /tmp, and the run takes it away when it stops MPS."""
    env, record = mps_env
    log = tmp_path / ("a-long-folder-name-for-logs-" * 3) / "log"
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "0",
        "--workers",
        "1",
        "--log-dir",
        log,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    pipe = record.read_text().splitlines()[0].split()[1].removeprefix("pipe=")
    assert pipe.startswith("/tmp/convtts-mps.") and not Path(pipe).exists()
    assert mps_requests(record) == ["start", "get_server_list", "quit"]


def test_mps_stops_after_failures_and_is_skipped_when_off(tmp_path, mps_env):
    env, record = mps_env
    records = llava_conversations(1)
    records[0]["conversations"][1]["value"] = "The zebra is grazing. " + records[0]["conversations"][1]["value"]
    source = write_input(tmp_path / "in.json", records)
    failing = dict(env, CONVTTS_TEST_FAIL_WORD="zebra")
    result = run_all(
        "--input",
        source,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "0",
        "--workers",
        "1",
        "--set",
        "tts.backend=flaky_backend:FlakyPiper",
        "--set",
        "workers.max_attempts=1",
        env=failing,
    )
    assert result.returncode == 1, result.stderr
    assert mps_requests(record) == ["start", "get_server_list", "quit"]

    record.unlink()
    off = run_all("--input", source, "--output-dir", tmp_path / "out2", "--gpus", "0", "--mps", "off", env=env)
    assert off.returncode == 0, off.stderr
    assert mps_requests(record) == []


def test_mps_that_cannot_start_is_reported_and_the_run_goes_on(tmp_path, small_input, mps_env):
    env, record = mps_env
    env["MPS_TEST_START_EXIT"] = "1"
    result = run_all("--input", small_input, "--output-dir", tmp_path / "out", "--gpus", "0", "--workers", "2", env=env)
    assert result.returncode == 0, result.stderr
    assert "running without MPS" in result.stderr
    assert mps_requests(record) == ["start"]  # nothing to stop: it never ran


def test_sigterm_stops_the_run_its_slots_and_mps_but_nothing_else(tmp_path, small_input, mps_env):
    env, record = mps_env
    out, log = tmp_path / "out", tmp_path / "log"
    # A bystander in the same process group, as under cron or a shell script: it must survive.
    bystander = subprocess.Popen(["sleep", "300"], process_group=0)
    run = subprocess.Popen(
        [
            "bash",
            str(REPO / "run_all.sh"),
            "--input",
            str(small_input),
            "--output-dir",
            str(out),
            "--gpus",
            "0",
            "--workers",
            "2",
            "--log-dir",
            str(log),
            "--set",
            "shards.segments_per_shard=8",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: os.setpgid(0, bystander.pid),
    )
    try:
        wait_for(lambda: (out / "work").is_dir() and len(spoken_so_far(out)) >= 4)
        workers = worker_pids(bystander.pid)  # run_all.sh joined the bystander's group
        assert workers, "no worker processes found"
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
        assert run.returncode == 143, stderr.decode()
        assert "TERM received" in stderr.decode()
        wait_for(lambda: not any(alive(pid) for pid in workers), timeout=30)
        assert bystander.poll() is None, "run_all.sh killed a process it did not start"
        assert mps_requests(record) == ["start", "get_server_list", "quit"]
    finally:
        bystander.kill()
        run.kill()

    again = run_all(
        "--input",
        small_input,
        "--output-dir",
        out,
        "--gpus",
        "0",
        "--workers",
        "2",
        "--log-dir",
        log,
        "--set",
        "shards.segments_per_shard=8",
        env=env,
    )
    assert again.returncode == 0, again.stderr
    assert_complete(out)
