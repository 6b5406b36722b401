"""Kill real runs with SIGKILL (the whole run, or one worker), rerun, and check nothing is lost or redone."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, assert_complete, read_jsonl, run_all, script_env, spoken_so_far, wait_for, worker_pids

pytestmark = pytest.mark.e2e

ARGS = ("--gpus", "cpu:2", "--set", "shards.segments_per_shard=8")


def start_run(source: Path, out: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            "bash",
            str(REPO / "run_all.sh"),
            "--input",
            str(source),
            "--output-dir",
            str(out),
            "--log-dir",
            str(log),
            *ARGS,
        ],
        env=script_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, so the test can kill the whole run at once
    )


@pytest.mark.parametrize("rerun_slots", ["cpu:2", "cpu:1"], ids=["same-slots", "fewer-slots"])
def test_sigkill_whole_run_then_rerun(tmp_path, small_input, rerun_slots):
    out, log = tmp_path / "out", tmp_path / "log"
    run = start_run(small_input, out, log)
    wait_for(lambda: (out / "work").is_dir() and len(spoken_so_far(out)) >= 12)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    wait_for(lambda: not worker_pids(run.pid), timeout=30)  # workers die with their slot
    before = {r["id"]: r for r in spoken_so_far(out)}
    stamps = {i: (out / r["audio"]).stat().st_mtime_ns for i, r in before.items()}
    assert 12 <= len(before) < len(read_jsonl_all_plan(out))

    # Completion is keyed on shards and ids, not on slot ranks: a rerun on fewer slots skips the same work.
    again = run_all("--input", small_input, "--output-dir", out, "--log-dir", log, *ARGS, "--gpus", rerun_slots)
    assert again.returncode == 0, again.stderr
    rows = {r["id"]: r for r in assert_complete(out)}
    for uid, row in before.items():  # finished work was kept, not redone
        assert rows[uid]["run"] == row["run"]
        assert (out / row["audio"]).stat().st_mtime_ns == stamps[uid]
    assert any(r["run"] != next(iter(before.values()))["run"] for r in rows.values())


def test_sigkill_one_worker_mid_run(tmp_path, small_input):
    out, log = tmp_path / "out", tmp_path / "log"
    run = start_run(small_input, out, log)
    wait_for(lambda: (out / "work").is_dir() and len(spoken_so_far(out)) >= 6)
    victims = worker_pids(run.pid)
    assert victims, "no worker process found"
    os.kill(victims[0], signal.SIGKILL)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr.decode()
    assert_complete(out)
    crashes = [c for p in (out / "work").glob("*.crashes.jsonl") for c in read_jsonl(p)]
    died = [line for p in log.rglob("slot-?.log") for line in p.read_text().splitlines() if "died" in line]
    assert died, "the slot did not notice the dead worker"
    assert len(crashes) <= 1 and all(c["exitcode"] == -9 for c in crashes)


def read_jsonl_all_plan(out: Path) -> list[dict]:
    rows = []
    for shard in (out / "plan" / "shards").glob("shard-?????.jsonl"):
        rows += read_jsonl(shard)
    return rows
