"""A real full disk: the output directory is a small tmpfs that the tests fill with a file of their own.

A full disk is nobody's utterance's fault: the run stops with one line and exit 1, records no
failures, leaves no half-written file, and the same command finishes once space is freed.
These tests mount filesystems, so they need root; they fail (not skip) without it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import soundfile as sf

from conftest import REPO, assert_complete, plan_ids, read_jsonl, run_all, script_env
from convtts.state.shardio import append_line, write_atomic

PLAN_ARGS = ("--count", "2", "--set", "shards.segments_per_shard=5", "--set", "tts.backend=paced_backend:PacedTone")
RUN_ARGS = ("--gpus", "cpu:1", "--workers", "1", *PLAN_ARGS)
ENV = {"CONVTTS_TEST_UTTERANCE_SECONDS": "0.01"}  # tones of the text's length, made at once


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs: the plan, the config and the audio of two conversations (about 7 MB) fit."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    assert mounted.returncode == 0, (
        f"these tests need a real small filesystem and mount it with `mount -t tmpfs` (run them as root): "
        f"{mounted.stderr.strip()}"
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int = 0) -> None:
    """Grow `path` until the filesystem has `leave` bytes free (to a page): 0 leaves no page at all."""
    with open(path, "ab", buffering=0) as fh:
        while (room := free_bytes(path.parent) - leave) > 0:
            fh.write(b"\0" * min(room, 1 << 20))


def disk_full_line(out: Path) -> str:
    return f"run_all.sh: no space left on device in {out}; free space and run the same command again"


def plan(source: Path, out: Path) -> None:
    made = subprocess.run(
        [sys.executable, str(REPO / "preprocess.py"), "--input", str(source), "--output-dir", str(out), *PLAN_ARGS],
        env=script_env(),
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr


def work_rows(out: Path, kind: str) -> list[dict]:
    """Rows of every work file of one kind; read strictly, so a torn or half line fails the test."""
    return [row for path in sorted((out / "work").glob(f"shard-*.{kind}.jsonl")) for row in read_jsonl(path)]


def temporaries(out: Path) -> list[str]:
    """Names of half-written files: write_atomic's hidden `.NAME.tmpPID`, plan staging folders."""
    return sorted(str(p.relative_to(out)) for p in out.rglob(".*") if ".tmp" in p.name or p.name.startswith(".plan-"))


@pytest.mark.e2e
@pytest.mark.parametrize("workers", [1, 2])  # with 2, the slot also stops a worker that may be mid-write
def test_full_disk_stops_the_run_cleanly_and_the_same_command_finishes(tmp_path, small_input, small_disk, workers):
    out, log, filler = small_disk / "out", tmp_path / "log", small_disk / "filler"
    plan(small_input, out)
    fill(filler, leave=1_000_000)  # room for a few utterances of the 28

    args = (
        "--input",
        small_input,
        "--output-dir",
        out,
        "--log-dir",
        log,
        "--gpus",
        "cpu:1",
        "--workers",
        workers,
        *PLAN_ARGS,
    )
    stopped = run_all(*args, env=script_env(**ENV))
    assert stopped.returncode == 1, stopped.stderr
    assert stopped.stderr.split("\n") == [disk_full_line(out), ""]
    spoken = work_rows(out, "manifest")
    assert 0 < len(spoken) < len(plan_ids(out)), "the disk should fill part way through the run"
    for row in spoken:  # what was written before the disk filled is whole
        data, rate = sf.read(out / row["audio"])
        assert len(data) == row["num_samples"] and rate == row["sample_rate"]
    assert temporaries(out) == []
    assert work_rows(out, "failures") == [] and work_rows(out, "crashes") == []
    assert all(orjson.loads(p.read_bytes())["failed"] == 0 for p in (out / "work").glob("*.stats.json"))
    said = [line for p in log.rglob("slot-0*.log") for line in p.read_text().splitlines()]
    assert any("No space left on device writing" in line and str(out) in line for line in said), said

    before = {row["id"]: (row["run"], (out / row["audio"]).stat().st_mtime_ns) for row in spoken}
    filler.unlink()
    again = run_all(*args, env=script_env(**ENV))
    assert again.returncode == 0, again.stderr
    rows = {row["id"]: row for row in assert_complete(out)}
    for uid, (run, stamp) in before.items():  # kept, not spoken again
        assert rows[uid]["run"] == run and (out / rows[uid]["audio"]).stat().st_mtime_ns == stamp
    assert temporaries(out) == []


@pytest.mark.e2e
def test_merge_and_plan_on_a_full_disk_keep_the_previous_results(tmp_path, small_input, small_disk):
    out, log, filler = small_disk / "out", tmp_path / "log", small_disk / "filler"
    done = run_all("--input", small_input, "--output-dir", out, "--log-dir", log, *RUN_ARGS, env=script_env(**ENV))
    assert done.returncode == 0, done.stderr
    results = ("manifest.jsonl", "failures.jsonl", "conversations.json", "summary.json", "config.yaml")
    before = {name: (out / name).read_bytes() for name in results}

    fill(filler, leave=len(before["manifest.jsonl"]) // 2)  # merge fails half way through manifest.jsonl
    merged = subprocess.run(  # --force: nothing changed since the run's merge, which would write nothing
        [sys.executable, "-m", "convtts.results.merge", str(out), "--force"],
        env=script_env(),
        capture_output=True,
        text=True,
    )
    assert merged.returncode == 4, merged.stderr
    assert "No space left on device writing" in merged.stderr and str(out) in merged.stderr
    assert {name: (out / name).read_bytes() for name in results} == before
    assert temporaries(out) == []

    fill(filler)  # not a byte left: preprocess cannot even rewrite config.yaml
    blocked = run_all("--input", small_input, "--output-dir", out, "--log-dir", log, *RUN_ARGS, env=script_env(**ENV))
    assert blocked.returncode == 1
    assert blocked.stderr.split("\n") == [disk_full_line(out), ""]
    assert {name: (out / name).read_bytes() for name in results} == before
    assert temporaries(out) == []

    filler.unlink()
    again = run_all("--input", small_input, "--output-dir", out, "--log-dir", log, *RUN_ARGS, env=script_env(**ENV))
    assert again.returncode == 0, again.stderr
    assert_complete(out)
    assert (out / "manifest.jsonl").read_bytes() == before["manifest.jsonl"]  # nothing redone, rebuilt the same


def test_a_failed_append_or_atomic_write_leaves_the_file_as_it_was(small_disk):
    manifest, stats = small_disk / "rows.jsonl", small_disk / "stats.json"
    line = orjson.dumps({"id": "a", "pad": ""}) + b"\n"
    manifest.write_bytes(
        orjson.dumps({"id": "a", "pad": "x" * (4096 - 99 - len(line))}) + b"\n"
    )  # 99 bytes left in its page
    stats.write_bytes(b'{"done": 1}')
    kept = manifest.read_bytes()
    fill(small_disk / "filler")

    with pytest.raises(OSError) as appended:
        append_line(manifest, {"id": "b", "text": "x" * 700})  # the first 99 bytes fit, the rest does not
    assert appended.value.errno == errno.ENOSPC and appended.value.filename == str(manifest)
    assert manifest.read_bytes() == kept

    with pytest.raises(OSError) as replaced:
        write_atomic(stats, b'{"done": 2}' + b" " * 8192)
    assert replaced.value.errno == errno.ENOSPC
    assert stats.read_bytes() == b'{"done": 1}'
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "rows.jsonl", "stats.json"]
