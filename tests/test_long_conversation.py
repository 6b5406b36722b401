"""A conversation longer than a shard is cut between turns across shards, so no slot idles while it is
spoken; its ids stay its own and conversations.json holds it once, whole."""

from __future__ import annotations

import orjson
import pytest

from conftest import DATA, assert_complete, llava_conversations, read_jsonl, run_all, write_input
from convtts.config import load_config
from convtts.plan.planner import make_plan
from convtts.state.layout import Layout

TARGET = 60  # segments a shard


def long_conversation() -> dict:
    """The 90 real GPT-4 question and answer pairs of LLaVA-Instruct as one conversation of 180 turns."""
    turns = []
    for pair in read_jsonl(DATA / "llava_gpt4_qa_30x3.jsonl"):
        turns += [{"from": "human", "value": pair["instruction"]}, {"from": "gpt", "value": pair["output"]}]
    return {"id": "coco-gpt4-qa", "conversations": turns}


def records() -> list[dict]:
    """A short conversation on either side of the long one."""
    short = llava_conversations(2)
    return [short[0], long_conversation(), short[1]]


def shard_contents(layout: Layout) -> list[tuple[list[dict], list[dict]]]:
    return [(read_jsonl(layout.shard_file(s)), read_jsonl(layout.shard_conversations(s))) for s in layout.shard_names()]


def test_a_long_conversation_is_cut_between_turns_across_shards(tmp_path):
    layout, config = Layout(tmp_path / "out"), load_config(None, [f"shards.segments_per_shard={TARGET}"])
    plan = make_plan(write_input(tmp_path / "in.json", records()), layout, config)
    shards = shard_contents(layout)
    cid = "coco-gpt4-qa"
    long_rows = [r for rows, _ in shards for r in rows if r["conversation_id"] == cid]
    assert len({r["turn"] for r in long_rows}) == 180 and len(long_rows) > 5 * TARGET
    holding = [n for n, (rows, _) in enumerate(shards) if any(r["conversation_id"] == cid for r in rows)]
    assert len(holding) > 5 and holding == list(range(holding[0], holding[-1] + 1))  # consecutive shards
    for rows, _ in shards:
        assert len(rows) <= TARGET or len({(r["conversation_id"], r["turn"]) for r in rows}) == 1
    # a turn's segments stay together, in order; ids are the conversation's, each once
    turn_shard = {}
    for n, (rows, _) in enumerate(shards):
        for r in rows:
            assert turn_shard.setdefault((r["conversation_id"], r["turn"]), n) == n
    ids = [r["id"] for rows, _ in shards for r in rows]
    assert len(ids) == len(set(ids)) == plan["segments"]
    assert [r["id"] for r in long_rows] == [f"{cid}-{r['turn']:03d}-{r['segment']:02d}" for r in long_rows]
    assert [(r["turn"], r["segment"]) for r in long_rows] == sorted((r["turn"], r["segment"]) for r in long_rows)
    # each record once, in input order, in the shard of its conversation's last turn
    lines = [(n, c["conversation_id"]) for n, (_, convs) in enumerate(shards) for c in convs]
    assert [c for _, c in lines] == [r["id"] for r in records()]
    assert [n for n, c in lines if c == cid] == [holding[-1]]
    # the short ones fit a shard: kept whole, as before
    for record in records()[::2]:
        assert len({n for n, (rows, _) in enumerate(shards) for r in rows if r["conversation_id"] == record["id"]}) == 1


def test_conversations_that_fit_a_shard_stay_whole(tmp_path):
    layout, config = Layout(tmp_path / "out"), load_config(None, ["shards.segments_per_shard=30"])
    make_plan(write_input(tmp_path / "in.json", llava_conversations()), layout, config)
    shards = shard_contents(layout)
    for rows, convs in shards:
        assert {r["conversation_id"] for r in rows} == {c["conversation_id"] for c in convs}


@pytest.mark.e2e
def test_a_long_conversation_is_spoken_by_every_slot_and_merged_once(tmp_path):
    source = write_input(tmp_path / "in.json", records())
    out = tmp_path / "out"
    settings = ["--set", "tts.backend=silence", "--set", f"shards.segments_per_shard={TARGET}"]
    result = run_all("--input", source, "--output-dir", out, "--gpus", "cpu:2", *settings)
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)  # every planned id once, its audio whole
    assert len(rows) == len({r["id"] for r in rows})
    slots = [orjson.loads((out / "work" / "slots" / f"slot-{rank}.json").read_bytes()) for rank in (0, 1)]
    long_shards = {r["audio"].split("/")[1] for r in rows if r["conversation_id"] == "coco-gpt4-qa"}
    assert len(long_shards) > 5 and {int(s[-5:]) % 2 for s in long_shards} == {0, 1}  # both slots' shares
    assert all(slot["done"] > 0 and slot["failed"] == 0 for slot in slots)
    assert sum(slot["done"] for slot in slots) == len(rows)
    merged = orjson.loads((out / "conversations.json").read_bytes())
    assert [c["id"] for c in merged] == [r["id"] for r in records()]
    audio: dict = {}
    for row in rows:
        audio.setdefault((row["conversation_id"], row["turn"]), []).append((row["segment"], row["audio"]))
    for record, given in zip(records(), merged):
        turns = [{k: v for k, v in t.items() if k not in ("audio", "language")} for t in given["conversations"]]
        assert turns == record["conversations"]
        for turn, item in enumerate(given["conversations"]):
            assert item["audio"] == [a for _, a in sorted(audio.get((record["id"], turn), []))]
    long_turns = merged[1]["conversations"]
    assert len(long_turns) == 180 and all(t["audio"] and t["language"] == "en" for t in long_turns)
