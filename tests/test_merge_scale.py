"""Merge lists work/ once for all shards (the same files as a glob per shard), can skip the audio check,
and remakes only the parts of the shards whose files changed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from conftest import llava_conversations, need, read_jsonl, run_all, script_env, write_input
from convtts.results.shard_part import RACY_NS
from convtts.state.layout import Layout, WorkListing

pytestmark = pytest.mark.e2e


def silence_run(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    out = tmp_path / "out"
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--gpus",
        "cpu:1",
        "--workers",
        "2",
        "--set",
        "tts.backend=silence",
        "--set",
        "shards.segments_per_shard=8",
        "--log-dir",
        tmp_path / "log",
    )
    assert result.returncode == 0, result.stderr
    return Layout(out)


def merge(out, *flags):
    return subprocess.run(
        [sys.executable, "-m", "convtts.results.merge", str(out), *flags],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_one_listing_finds_what_a_glob_per_shard_finds(tmp_path):
    layout = silence_run(tmp_path)
    shards = layout.shard_names()
    work = layout.work_dir
    # an older output's single-writer files, another writer's files, and what must not count
    shutil.copy(next(iter(layout.manifests(shards[0]))), layout.manifest(shards[0]))
    (work / f"{shards[1]}.w7.failures.jsonl").write_bytes(b"")
    (work / f"{shards[1]}.failures.jsonl").write_bytes(b"")
    (work / f".{shards[1]}.w0.manifest.jsonl.tmp999").write_bytes(b"")
    (work / f"{shards[2]}.w0.manifest.jsonl.rewrite").write_bytes(b"")
    listing = WorkListing(layout)
    assert len(layout.manifests(shards[0])) >= 2 and len(layout.failure_files(shards[1])) == 2
    for shard in [*shards, "shard-99999"]:
        assert listing.manifests(shard) == layout.manifests(shard)
        assert listing.failure_files(shard) == layout.failure_files(shard)


def test_no_audio_check_counts_rows_without_opening_their_audio(tmp_path):
    layout = silence_run(tmp_path)
    rows = read_jsonl(layout.manifest_file)
    (layout.root / rows[0]["audio"]).unlink()

    checked = merge(layout.root)
    assert checked.returncode == 1  # the row without audio is pending again
    summary = orjson.loads(layout.summary_file.read_bytes())
    assert summary["done"] == len(rows) - 1 and summary["pending"] == 1

    trusted = merge(layout.root, "--no-audio-check")
    assert trusted.returncode == 0, trusted.stderr
    assert read_jsonl(layout.manifest_file) == rows


def part_stamps(layout):
    return {p.name: p.stat().st_mtime_ns for p in layout.merge_dir.rglob("*.part")}


def output_bytes(layout):
    return {p.name: p.read_bytes() for p in (layout.manifest_file, layout.failures_file, layout.conversations_file)}


def test_a_merge_remakes_only_the_parts_of_shards_that_changed(tmp_path):
    layout = silence_run(tmp_path)
    time.sleep(RACY_NS / 1e9)  # files written just now are not trusted by their times: let them age
    assert merge(layout.root).returncode == 0
    parts, outputs = part_stamps(layout), output_bytes(layout)
    assert len(parts) == len(layout.shard_names()) > 2

    unchanged = merge(layout.root)
    assert unchanged.returncode == 0 and "nothing changed since the last merge" in unchanged.stdout
    assert part_stamps(layout) == parts and output_bytes(layout) == outputs

    rows = read_jsonl(layout.manifest_file)
    lost = rows[len(rows) // 2]
    (layout.root / lost["audio"]).unlink()
    changed = merge(layout.root)
    assert changed.returncode == 1 and "nothing changed" not in changed.stdout  # the row is pending again
    remade = {name for name, stamp in part_stamps(layout).items() if parts[name] != stamp}
    assert remade == {f"{Path(lost['audio']).parent.name}.part"}
    assert read_jsonl(layout.manifest_file) == [row for row in rows if row["id"] != lost["id"]]
    assert orjson.loads(layout.summary_file.read_bytes())["pending"] == 1

    merged = output_bytes(layout)
    shutil.rmtree(layout.merge_dir)  # every part made again, from the work files alone: the same outputs
    assert merge(layout.root).returncode == 1 and output_bytes(layout) == merged
    layout.conversations_file.unlink()  # an output removed by hand is written again, though no part changed
    assert merge(layout.root).returncode == 1 and output_bytes(layout) == merged


def test_the_report_read_a_line_at_a_time_gives_each_speakers_hours_and_every_failure(tmp_path):
    need("matplotlib", "report")
    layout = silence_run(tmp_path)
    rows = read_jsonl(layout.manifest_file)
    (layout.root / rows[0]["audio"]).unlink()
    assert merge(layout.root).returncode == 1  # one row pending: failures.jsonl has a line that is not listed
    rows = read_jsonl(layout.manifest_file)
    made = subprocess.run(
        [sys.executable, "-m", "convtts.results.report", str(layout.root)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    page = (layout.root / "report.html").read_text().replace("\n", "")
    seconds = {}
    for row in rows:
        seconds[row["speaker"]] = seconds.get(row["speaker"], 0.0) + row["duration"]
    assert len(seconds) >= 2
    for speaker, total in seconds.items():
        assert f"<td>{speaker}</td><td>{speaker}</td><td>{total / 3600:.3f}</td>" in page
    assert "<h2>Failed or refused by the gate (0)</h2>" in page  # a pending row is neither
    assert "<h2>Re-spoken (0)</h2>" in page
