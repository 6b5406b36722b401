"""A plan of more than a thousand shards keeps them, their work and their audio a thousand a folder;
outputs laid out flat before keep their layout."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import assert_complete, read_jsonl, run_all, script_env, write_input
from convtts.config import load_config
from convtts.plan.planner import make_plan
from convtts.state.layout import FAN_OUT_SHARDS, Layout, shard_folder

SHORT = [{"from": "human", "value": "What is in the picture?"}, {"from": "gpt", "value": "A red bus on a bridge."}]
PLAN = ["--set", "shards.segments_per_shard=2", "--set", "tts.backend=silence"]  # a conversation a shard


def conversations(count: int) -> list[dict]:
    return [{"id": f"c{i:05d}", "conversations": SHORT} for i in range(count)]


def largest_folder(root) -> int:
    return max(len(os.listdir(folder)) for folder, _, _ in os.walk(root))


@pytest.mark.e2e
def test_a_job_of_more_than_a_thousand_shards_runs_and_resumes_a_thousand_a_folder(tmp_path):
    source = write_input(tmp_path / "in.json", conversations(FAN_OUT_SHARDS + 150))
    out, log = tmp_path / "out", tmp_path / "log"
    args = ["--input", source, "--output-dir", out, "--log-dir", log, "--gpus", "cpu:1", "--workers", "2", *PLAN]
    done = run_all(*args, env=script_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    layout = Layout(out)
    assert layout.fanned() and len(layout.shard_names()) == FAN_OUT_SHARDS + 150
    assert not list(layout.shards_dir.glob("shard-*")) and not list(layout.work_dir.glob("shard-*"))
    rows = assert_complete(out)
    assert len(rows) == 2 * (FAN_OUT_SHARDS + 150)
    late = [row for row in rows if row["conversation_id"] == "c01042"]
    assert {row["audio"].rpartition("/")[0] for row in late} == {"audio/01/shard-01042"}
    assert layout.stats("shard-01042") == out / "work" / "01" / "shard-01042.stats.json"
    assert largest_folder(out) <= 2 * FAN_OUT_SHARDS  # a shard's two plan files, a thousand of them

    # a rerun finds the audio deleted from one folder and speaks it again, and only it
    gone = out / late[0]["audio"]
    gone.unlink()
    again = run_all(*args, env=script_env(), timeout=600)
    assert again.returncode == 0, again.stderr
    rows = assert_complete(out)
    respoken = [row for row in rows if row["id"] == late[0]["id"]]
    assert len(respoken) == 1 and respoken[0]["finished"] > late[0]["finished"]


def test_a_plan_of_a_thousand_shards_or_fewer_stays_in_one_folder(tmp_path):
    layout = Layout(tmp_path / "out")
    make_plan(write_input(tmp_path / "in.json", conversations(FAN_OUT_SHARDS)), layout, load_config(None, PLAN[1::2]))
    assert not layout.fanned() and len(list(layout.shards_dir.glob("shard-*.jsonl"))) == 2 * FAN_OUT_SHARDS


def test_an_output_whose_work_is_flat_keeps_its_layout_when_planned_again(tmp_path):
    """An output of an earlier version (every one was flat), planned again with the same shards."""
    layout = Layout(tmp_path / "out")
    source = write_input(tmp_path / "in.json", conversations(FAN_OUT_SHARDS + 5))
    config = load_config(None, PLAN[1::2])
    make_plan(source, layout, config)
    assert layout.fanned()
    moved = layout.shards_dir.parent / "flat"  # the same plan, laid out as earlier versions did
    moved.mkdir()
    for path in layout.shards_dir.glob("*/shard-*"):
        path.rename(moved / path.name)
    shutil.rmtree(layout.shards_dir)
    moved.rename(layout.shards_dir)
    layout.work_dir.mkdir()
    (layout.work_dir / "shard-00000.w0.manifest.jsonl").write_text("")
    assert not layout.fanned() and layout.all_manifests() == [layout.work_dir / "shard-00000.w0.manifest.jsonl"]
    make_plan(source, layout, config)
    assert not layout.fanned() and len(layout.shard_names()) == FAN_OUT_SHARDS + 5
    assert read_jsonl(layout.shard_file("shard-01004"))[0]["conversation_id"] == "c01004"
    assert shard_folder("shard-01004") == "01"
