"""Progress as people see it: bars on a terminal (even one that reports no size), plain lines under cron."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time

import orjson
import pytest

from conftest import REPO, run_all, script_env


def read_pty(fd: int, seconds: float) -> str:
    chunks, deadline = [], time.time() + seconds
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunks.append(os.read(fd, 65536))
            except OSError:
                break
    return b"".join(chunks).decode(errors="replace")


def test_monitor_draws_a_bar_per_slot_on_a_terminal_without_a_size(tmp_path):
    slots = tmp_path / "out" / "work" / "slots"
    slots.mkdir(parents=True)
    now = time.time()
    for rank, (done, total) in enumerate([(31, 31), (7, 26)]):
        status = {
            "rank": rank,
            "total": total,
            "done": done,
            "failed": 0,
            "audio_seconds": 40.0 * (rank + 1),
            "started": now - 20,
            "updated": now - 10,
            "finished": done == total,
        }
        (slots / f"slot-{rank}.json").write_bytes(orjson.dumps(status))
    parent, child = pty.openpty()  # a fresh pty reports 0 columns and 0 rows
    monitor = subprocess.Popen(
        [sys.executable, "-m", "convtts.run.progress", str(tmp_path / "out"), "--slots", "2"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    try:
        screen = read_pty(parent, 3.0)
    finally:
        monitor.kill()
        monitor.wait()
        os.close(parent)
    assert "slot 0: 100%" in screen and "31/31" in screen
    assert "slot 1:" in screen and "7/26" in screen
    assert "4.00 audio s/s" in screen  # the finished slot: 40 s of audio over its 10 s, frozen at its end


@pytest.mark.e2e
def test_under_cron_progress_is_plain_lines_in_the_slot_log_and_stdout_is_the_summary(tmp_path, small_input):
    log = tmp_path / "log"
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "cpu:1",
        "--workers",
        "2",
        "--set",
        "workers.progress_interval=0.5",
        "--log-dir",
        log,
        env=script_env(),
    )
    assert result.returncode == 0, result.stderr
    lines = next(log.rglob("slot-0.log")).read_text().splitlines()
    progress = [line for line in lines if " utterances (" in line and "audio s/s" in line and "eta" in line]
    assert len(progress) >= 2, "no periodic progress line in the slot log"
    assert result.stdout.splitlines()[0].startswith("conversations ") and len(result.stdout.splitlines()) == 3
    assert "\r" not in result.stdout + result.stderr and result.stderr == ""


@pytest.mark.e2e
def test_progress_counts_planned_audio_and_says_while_workers_load(tmp_path, small_input):
    """The share done and the time left come from the plan's words (estimated audio), not from
    utterance counts; while workers load their model the line says so and gives no estimate."""
    out, log = tmp_path / "out", tmp_path / "log"
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        out,
        "--gpus",
        "cpu:1",
        "--workers",
        "2",
        "--log-dir",
        log,
        "--set",
        "workers.progress_interval=0.3",
        "--set",
        "tts.backend=paced_backend:PacedTone",
        env=script_env(CONVTTS_TEST_LOAD_SECONDS=3, CONVTTS_TEST_UTTERANCE_SECONDS=0.1),
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in next(log.rglob("slot-0.log")).read_text().splitlines() if " utterances (" in line]
    loading = [line for line in lines if "still loading their model" in line]
    assert loading and all("eta not known yet" in line for line in loading), lines
    estimates = [line for line in lines if re.search(r"\d+% of [\d.]+ h planned, eta [\d.]+ min", line)]
    assert len(estimates) >= 2, lines
    plan = orjson.loads((out / "plan" / "plan.json").read_bytes())
    status = orjson.loads((out / "work" / "slots" / "slot-0.json").read_bytes())
    assert abs(status["planned_audio_seconds"] - plan["words"] * 60 / 150) < 1.0  # text.words_per_minute 150
    assert status["planned_share_done"] == 1.0 and status["finished"] and status["loading"] == 0
