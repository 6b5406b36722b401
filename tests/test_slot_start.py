"""What a slot reads as it starts: the plan's own counts of each shard, and work/ listed once, kept
current with the files its own workers write. On a real plan of the LLaVA sample, no processes."""

from __future__ import annotations

import numpy as np
import orjson
import soundfile as sf

from conftest import llava_conversations, preprocess, read_jsonl, write_input
from convtts.run.pieces import WorkQueue
from convtts.state.layout import Layout, WorkListing
from convtts.state.shardio import append_line, read_json, shard_complete_and_whole

RUN = "run1"


def planned(tmp_path) -> Layout:
    source = write_input(tmp_path / "convs.json", llava_conversations(12))
    made = preprocess("--input", source, "--output-dir", tmp_path / "out", "--set", "shards.segments_per_shard=20")
    assert made.returncode == 0, made.stderr
    return Layout(tmp_path / "out")


def spoken(layout: Layout, shard: str, uid: str, writer: str) -> None:
    """A row and its audio, as a worker writes them."""
    audio = layout.audio_dir(shard) / f"{uid}.wav"
    audio.parent.mkdir(parents=True, exist_ok=True)
    sf.write(audio, np.full(1600, 0.1, dtype=np.float32), 16000)
    row = {"id": uid, "audio": str(audio.relative_to(layout.root)), "num_samples": 1600, "duration": 0.1, "run": RUN}
    append_line(layout.manifest(shard, writer), row)


def test_the_plan_counts_each_shards_segments(tmp_path):
    layout = planned(tmp_path)
    plan = read_json(layout.plan_file)
    sizes = [len(read_jsonl(layout.shard_file(shard))) for shard in plan["shards"]]
    assert len(sizes) > 3 and plan["shard_segments"] == sizes and sum(sizes) == plan["segments"]


def test_a_slot_counts_its_work_from_the_plan_and_the_count_is_exact(tmp_path):
    layout = planned(tmp_path)
    shards = layout.shard_names()
    first = [row["id"] for row in read_jsonl(layout.shard_file(shards[0]))]
    layout.work_dir.mkdir(parents=True, exist_ok=True)
    for uid in first[:3]:
        spoken(layout, shards[0], uid, "w7")  # an earlier run's worker began the first shard
    queue = WorkQueue(layout, shards, RUN, workers=2, listing=WorkListing(layout))
    estimated = queue.total
    assert estimated == read_json(layout.plan_file)["segments"] - 3
    while queue.waiting:
        queue.open_until_pending()
    assert queue.total == estimated  # every shard open: the figure the counts gave


def test_the_marker_names_the_files_the_slots_workers_wrote_after_the_listing(tmp_path):
    layout = planned(tmp_path)
    shard = layout.shard_names()[1]
    ids = [row["id"] for row in read_jsonl(layout.shard_file(shard))]
    layout.work_dir.mkdir(parents=True, exist_ok=True)
    spoken(layout, shard, ids[0], "w5")  # listed as the slot starts
    listing = WorkListing(layout)
    queue = WorkQueue(layout, [shard], RUN, workers=2, listing=listing)
    while (piece := queue.next_piece()) is not None:
        for uid in piece.ids:
            spoken(layout, shard, uid, "w1")  # not in the listing: worker 1's file is new
            piece.started.add(uid)
            queue.reported(piece, uid, True, audio_seconds=0.1)
    facts = orjson.loads(layout.stats(shard).read_bytes())["facts"]
    work = layout.work_dir
    assert facts["manifests"] == {p.name: p.stat().st_size for p in sorted(work.glob(f"{shard}.*.manifest.jsonl"))}
    assert set(facts["manifests"]) == {f"{shard}.w5.manifest.jsonl", f"{shard}.w1.manifest.jsonl"}
    assert facts["rows"] == len(ids) and len(facts["audio"]) == len(ids)
    assert shard_complete_and_whole(layout, shard, WorkListing(layout))  # a rerun trusts it as it is
    append_line(layout.manifest(shard, "w1"), {"id": ids[1], "audio": "audio/elsewhere.wav", "num_samples": 1})
    assert not shard_complete_and_whole(layout, shard, WorkListing(layout))  # a row since: checked, and damaged


def test_the_count_comes_from_the_plan_not_from_reading_the_shard_files(tmp_path):
    layout = planned(tmp_path)
    shards = layout.shard_names()
    path = layout.shard_file(shards[-1])
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:1]))  # cut to one row by hand
    queue = WorkQueue(layout, shards, RUN, workers=2, listing=WorkListing(layout))
    assert queue.total == read_json(layout.plan_file)["segments"]  # as planned: the file was not read
    while queue.waiting:
        queue.open_until_pending()
    assert queue.total == sum(len(read_jsonl(layout.shard_file(s))) for s in shards)  # opened: what it holds
