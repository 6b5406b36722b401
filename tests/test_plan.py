"""The plan: ids, selection, skipped turns, voices, shard coverage, freshness, and bad input through preprocess.py."""

from __future__ import annotations

import hashlib
import os
import random
import re

import orjson
import pytest

from conftest import llava_conversations, preprocess, read_jsonl, write_input
from convtts.config import load_config
from convtts.plan import batches, conversation, freshness, reader
from convtts.plan.freshness import plan_is_fresh
from convtts.plan.ids import MAX_ID_CHARS, safe_id, select, unique_ids
from convtts.plan.planner import make_plan
from convtts.plan.reader import InputError
from convtts.plan.voices import side_voices
from convtts.state.layout import Layout

SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def plan_rows(out) -> list[dict]:
    layout = Layout(out)
    return [row for shard in layout.shard_names() for row in read_jsonl(layout.shard_file(shard))]


def plan_conversations(out) -> list[dict]:
    layout = Layout(out)
    return [row for shard in layout.shard_names() for row in read_jsonl(layout.shard_conversations(shard))]


def convo(cid, *values, roles=("human", "gpt")) -> dict:
    record = {"conversations": [{"from": roles[i % len(roles)], "value": v} for i, v in enumerate(values)]}
    return record if cid is None else {"id": cid, **record}


# --- reading --------------------------------------------------------------------------------------

TRICKY = [
    {"id": "q", "conversations": [{"from": "human", "value": 'quote " and ] } [ { brackets \\'}]},
    {"id": 2, "conversations": [{"from": "gpt", "value": "naïve 東京 \u2028 🎉", "x": [[[[[[[[[[1]]]]]]]]]]}]},
    7,
    "text",
    None,
    [1, {"a": "}"}],
    {"nested": {"deeper": {"deepest": {"a": [{"b": [{"c": "]"}]}]}}}},
]


@pytest.mark.parametrize(
    "encode",
    [
        lambda rs: orjson.dumps(rs),
        lambda rs: orjson.dumps(rs, option=orjson.OPT_INDENT_2),
        lambda rs: b"\xef\xbb\xbf \r\n" + orjson.dumps(rs, option=orjson.OPT_INDENT_2) + b"\n\n",
        lambda rs: b"\xef\xbb\xbf" + b"\n\n".join(orjson.dumps(r) for r in rs) + b"\n",  # JSON lines
    ],
)
@pytest.mark.parametrize("chunk", [3, 64, 1 << 20])
def test_reader_streams_records_with_their_spans(tmp_path, monkeypatch, encode, chunk):
    monkeypatch.setattr(reader, "CHUNK", chunk)  # records cross the edges of the read window
    path = tmp_path / "in.json"
    path.write_bytes(encode(TRICKY))
    found = list(reader.scan(path))
    assert [value for _, _, value in found] == TRICKY
    raws = list(reader.read_spans(path, [(offset, length) for offset, length, _ in found]))
    assert [orjson.loads(raw) for raw in raws] == TRICKY


@pytest.mark.parametrize(
    "content, where",
    [
        (b'[{"a": 1},\n {"b": 2,, }]', "line 2, column 10"),
        (b'[{"a": 1}\n{"b": 2}]', "expected ',' or ']'"),
        (b'[{"a": 1},]', "found ']'"),
        (b'[{"a": "never closed}]', "cut off by the end of the file"),
        (b'[{"a": 1}', "not closed"),
        (b'[{"a": 1}] trailing', "after the closing ']'"),
        (b'{"a": 1}\n{"b": \n', "line 2"),
        (b'{\n  "a": 1\n}\n', "pretty-printed single object"),
        (b"  \n", "empty"),
    ],
)
def test_reader_says_where_the_json_breaks(tmp_path, content, where):
    path = tmp_path / "in.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match=re.escape(where)):
        list(reader.scan(path))


# --- ids ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["../../x", "..\\x", "a/b", "日本語", "con dé", ".hidden", "-rf", "x" * 1000, "..."])
def test_safe_id_is_a_bounded_file_name(raw):
    safe = safe_id(raw)
    assert SAFE.match(safe) and len(safe) <= MAX_ID_CHARS
    assert safe != raw and safe == safe_id(raw)


def test_safe_ids_keep_good_ids_and_never_collide():
    assert safe_id("000000525439") == "000000525439" and safe_id("i6IyJda_0") == "i6IyJda_0"
    assert len({safe_id(r) for r in ["../../x", "..\\x", "__x", "_.._x", "x", "x/"]}) == 6


def test_unique_ids_suffix_repeats_in_file_order():
    assert unique_ids(["a", "b", "a", "a"]) == ["a-1", "b", "a-2", "a-3"]
    # a genuine id that looks like a suffixed one is left alone; the repeat skips past it
    assert unique_ids(["a", "a", "a-1"]) == ["a-2", "a-3", "a-1"]


def test_plan_ids_are_unique_safe_and_stable(tmp_path):
    records = [
        convo("dup", "Hi."),
        convo("dup", "Hello."),
        convo(7, "Seven."),
        convo(None, "No id here."),
        convo(None, "No id here."),
        convo("../../x", "Escape?"),
        convo("..\\x", "Escape too?"),
        convo("Ünïcode id", "Name."),
        convo("y" * 500, "Long."),
    ]
    source = write_input(tmp_path / "in.json", records)
    make_plan(source, Layout(tmp_path / "out"), load_config(None))
    ids = [c["conversation_id"] for c in plan_conversations(tmp_path / "out")]
    assert len(ids) == len(set(ids)) == len(records)
    assert all(SAFE.match(i) and len(i) <= MAX_ID_CHARS + 4 for i in ids)
    assert ids[:3] == ["dup-1", "dup-2", "7"]
    # two identical records without an id: one content hash, told apart by occurrence
    assert ids[3].startswith("auto-") and ids[3].endswith("-1") and ids[4] == ids[3][:-2] + "-2"
    assert [c["record"] for c in plan_conversations(tmp_path / "out")] == records  # records kept unchanged
    make_plan(source, Layout(tmp_path / "again"), load_config(None))
    assert [c["conversation_id"] for c in plan_conversations(tmp_path / "again")] == ids
    names = [r["id"] for r in plan_rows(tmp_path / "out")]
    assert all(SAFE.match(n) for n in names) and len(names) == len(set(names))


# --- selection ------------------------------------------------------------------------------------

IDS = [f"conv-{i}" for i in range(2000)]


def test_selection_is_seeded_and_deterministic():
    def chosen(**select_args):
        cfg = load_config(None, [f"select.{k}={v}" for k, v in select_args.items()]).select
        return {IDS[i] for i in select(IDS, cfg)}

    assert chosen(fraction=0.1, seed=1) == chosen(fraction=0.1, seed=1)
    assert chosen(fraction=0.1, seed=1) != chosen(fraction=0.1, seed=2)
    assert 150 < len(chosen(fraction=0.1)) < 250
    assert chosen(fraction=0.05) <= chosen(fraction=0.1)  # a larger fraction keeps what a smaller one kept
    assert len(chosen(count=123, seed=5)) == 123 and chosen(count=123, seed=5) == chosen(count=123, seed=5)
    assert chosen(count=123, seed=5) != chosen(count=123, seed=6)
    assert len(chosen(count=5000)) == 2000 and len(chosen()) == 2000


@pytest.mark.parametrize("how", ["select.fraction=0.3", "select.count=7"])
def test_selection_does_not_depend_on_record_order(tmp_path, how):
    records = llava_conversations()
    shuffled = random.Random(3).sample(records, len(records))
    config = load_config(None, [how, "select.seed=11"])
    make_plan(write_input(tmp_path / "a.json", records), Layout(tmp_path / "a"), config)
    make_plan(write_input(tmp_path / "b.jsonl", shuffled, jsonl=True), Layout(tmp_path / "b"), config)
    picked_a = {c["conversation_id"] for c in plan_conversations(tmp_path / "a")}
    picked_b = {c["conversation_id"] for c in plan_conversations(tmp_path / "b")}
    assert picked_a == picked_b and 0 < len(picked_a) < len(records)


# --- shards ---------------------------------------------------------------------------------------


def test_every_selected_segment_is_in_exactly_one_shard(tmp_path):
    records = llava_conversations()  # real LLaVA text: lists, quotes, long answers
    config = load_config(None, ["shards.segments_per_shard=25", "select.fraction=0.7", "text.max_words=20"])
    plan = make_plan(write_input(tmp_path / "in.json", records), Layout(tmp_path / "out"), config)
    layout = Layout(tmp_path / "out")
    assert plan["shards"] == layout.shard_names() == [f"shard-{i:05d}" for i in range(len(plan["shards"]))]
    kept = [c["conversation_id"] for c in plan_conversations(tmp_path / "out")]
    assert len(kept) == len(set(kept)) == plan["conversations"]
    shard_of: dict[str, set] = {}
    seen = []
    for shard in plan["shards"]:
        here = {c["conversation_id"] for c in read_jsonl(layout.shard_conversations(shard))}
        for row in read_jsonl(layout.shard_file(shard)):
            assert row["conversation_id"] in here  # a line belongs to a conversation of its shard
            shard_of.setdefault(row["conversation_id"], set()).add(shard)
            seen.append(row["id"])
    assert all(len(s) == 1 for s in shard_of.values())  # conversations are kept whole
    assert len(seen) == len(set(seen)) == plan["segments"]
    # the expected segments, rebuilt from the selected records, are exactly those in the shards
    by_id = {r["id"]: r for r in records}
    expected = []
    for cid in kept:
        segments, _ = conversation.plan_conversation(cid, by_id[cid], config)
        expected += [s["id"] for s in segments]
    assert sorted(expected) == sorted(seen)
    rows = plan_rows(tmp_path / "out")
    assert all(1 <= r["words"] <= 20 and r["words"] == len(r["text"].split()) for r in rows)
    assert all(re.fullmatch(re.escape(r["conversation_id"]) + r"-\d{3}-\d{2}", r["id"]) for r in rows)
    assert plan["words"] == sum(r["words"] for r in rows)
    assert plan["estimated_hours"] == pytest.approx(plan["words"] / 150 / 60, abs=1e-3)
    for shard in plan["shards"]:  # about 25 a shard; only a conversation alone may hold more
        size = len(read_jsonl(layout.shard_file(shard)))
        assert 0 < size <= 25 or len(read_jsonl(layout.shard_conversations(shard))) == 1


def test_shard_line_fields(tmp_path):
    source = write_input(tmp_path / "in.jsonl", llava_conversations(2), jsonl=True)
    make_plan(source, Layout(tmp_path / "out"), load_config(None))
    row = plan_rows(tmp_path / "out")[0]
    first = plan_conversations(tmp_path / "out")[0]
    assert first["conversation_id"] == row["conversation_id"]
    assert orjson.dumps(first["record"]) == source.read_bytes().splitlines()[0]  # the record, byte for byte
    assert list(row) == [
        "id",
        "conversation_id",
        "source_id",
        "turn",
        "segment",
        "role",
        "side",
        "speaker",
        "language",
        "text",
        "source_text",
        "words",
    ]
    assert row["source_text"].startswith("<image>\n") and "<image>" not in row["text"]
    assert (row["role"], row["side"], row["turn"], row["segment"]) == ("human", "human", 0, 0)


def test_parallel_planning_writes_the_same_plan(tmp_path, monkeypatch):
    records = llava_conversations() * 3  # repeated ids as well
    source = write_input(tmp_path / "in.json", records)
    config = load_config(None, ["shards.segments_per_shard=40"])
    make_plan(source, Layout(tmp_path / "serial"), config, workers=1)
    monkeypatch.setattr(batches, "PARALLEL_MIN", 0)
    monkeypatch.setattr(batches, "BATCH", 7)
    make_plan(source, Layout(tmp_path / "parallel"), config, workers=2)
    for name in Layout(tmp_path / "serial").shard_names():
        for path in (Layout(tmp_path / n).shard_file(name) for n in ("serial", "parallel")):
            assert path.is_file()
        assert (
            Layout(tmp_path / "serial").shard_file(name).read_bytes()
            == Layout(tmp_path / "parallel").shard_file(name).read_bytes()
        )
    assert Layout(tmp_path / "serial").shard_names() == Layout(tmp_path / "parallel").shard_names()


# --- skipped turns and bad items ------------------------------------------------------------------


def test_bad_turns_are_skipped_with_reasons(tmp_path):
    records = [
        convo("ok", "<image>\nWhat is this?", "A cat on a mat."),
        {
            "id": "mixed",
            "conversations": [
                {"from": "human", "value": ""},
                {"from": "gpt", "value": 42},
                {"from": "human", "value": "word " * 20_000},
                {"from": "gpt", "value": "\x00\x01\x02"},
                {"from": "system", "value": "You are helpful."},
                {"from": "narrator", "value": "Once upon a time."},
                {"from": "human", "value": "<image>"},
                {"from": "gpt", "value": "```\ncode()\n```"},
                "not a turn",
                {"from": "USER", "value": "Still \x07speaks\u200b fine 🎉."},
            ],
        },
        {"id": "no-conversations"},
        ["not", "a", "record"],
    ]
    plan = make_plan(write_input(tmp_path / "in.json", records), Layout(tmp_path / "out"), load_config(None))
    skipped = {r["id"]: r for r in read_jsonl(Layout(tmp_path / "out").skipped_file)}
    reasons = {k: v["reason"] for k, v in skipped.items()}
    assert reasons["mixed-000"] == "empty"
    assert "not a string" in reasons["mixed-001"]
    assert "max_turn_chars" in reasons["mixed-002"]
    assert reasons["mixed-003"] == "no speakable characters"
    assert "speak_roles" in reasons["mixed-004"]
    assert "unknown role 'narrator'" == reasons["mixed-005"]
    assert reasons["mixed-006"] == "only a placeholder" and reasons["mixed-007"] == "only code"
    assert "not an object" in reasons["mixed-008"]
    assert "conversations" in reasons["record-2"] and "not an object" in reasons["record-3"]
    assert all(r["status"] == "skipped" for r in skipped.values())
    assert skipped["mixed-001"]["conversation_id"] == "mixed" and skipped["mixed-001"]["turn"] == 1
    spoken = [r for r in plan_rows(tmp_path / "out") if r["conversation_id"] == "mixed"]
    assert [(r["id"], r["text"], r["side"]) for r in spoken] == [("mixed-009-00", "Still speaks fine.", "human")]
    assert (plan["skipped_turns"], plan["skipped_records"], plan["conversations"]) == (9, 2, 2)


# --- voices ---------------------------------------------------------------------------------------


def test_by_role_voices_differ_within_and_vary_across_conversations():
    cfg = load_config(None).speakers
    pairs = [side_voices(f"c{i}", cfg) for i in range(200)]
    assert all(p["human"] != p["assistant"] for p in pairs)
    assert {p["human"] for p in pairs} == {"joe", "joe-slow"}
    assert pairs == [side_voices(f"c{i}", cfg) for i in range(200)]
    reseeded = load_config(None, ["speakers.seed=9"]).speakers
    assert pairs != [side_voices(f"c{i}", reseeded) for i in range(200)]
    fixed = load_config(None, ["speakers.human=[joe]"]).speakers
    assert all(
        side_voices(f"c{i}", fixed) == {"human": "joe", "assistant": "joe-slow", "system": "joe-slow"}
        for i in range(50)
    )


def test_voice_policies_in_the_plan(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(10))
    for policy in ("by_role", "per_turn", "single"):
        make_plan(source, Layout(tmp_path / policy), load_config(None, [f"speakers.policy={policy}"]))
    by_role = plan_rows(tmp_path / "by_role")
    for cid in {r["conversation_id"] for r in by_role}:
        voices = {(r["side"], r["speaker"]) for r in by_role if r["conversation_id"] == cid}
        assert len(voices) == 2 and len({v for _, v in voices}) == 2
    assert len({(r["conversation_id"], r["side"], r["speaker"]) for r in plan_rows(tmp_path / "per_turn")}) > 20
    assert {r["speaker"] for r in plan_rows(tmp_path / "single")} == {"joe"}


# --- freshness and atomic replacement -------------------------------------------------------------


def test_plan_freshness(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    layout, config = Layout(tmp_path / "out"), load_config(None)
    assert not plan_is_fresh(source, layout, config)
    make_plan(source, layout, config)
    assert plan_is_fresh(source, layout, config)
    assert plan_is_fresh(
        source, layout, load_config(None, ["workers.per_slot=3", "workers.seed=7", "output.audio_format=flac"])
    )
    for change in ("text.max_words=10", "select.fraction=0.5", "speakers.seed=1", "shards.segments_per_shard=7"):
        assert not plan_is_fresh(source, layout, load_config(None, [change]))
    # the plan knows its input by content: touched, or the same bytes elsewhere, it is the same input
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert plan_is_fresh(source, layout, config)
    moved = tmp_path / "elsewhere" / "renamed.json"
    moved.parent.mkdir()
    moved.write_bytes(source.read_bytes())
    assert plan_is_fresh(moved, layout, config)
    source.write_bytes(source.read_bytes().replace(b"the", b"The", 1))  # one letter, same size
    assert source.stat().st_size == moved.stat().st_size and not plan_is_fresh(source, layout, config)


def test_content_digest_is_the_sha256_of_the_bytes_and_follows_a_change(tmp_path):
    path = tmp_path / "in.json"
    data = os.urandom(freshness.HASH_BLOCK * 2 + 17)  # whole blocks and a partial one
    path.write_bytes(data)
    assert freshness.content_digest(path) == hashlib.sha256(data).hexdigest()
    path.write_bytes(data + b"]")
    assert freshness.content_digest(path) == hashlib.sha256(data + b"]").hexdigest()


def test_bad_input_keeps_the_old_plan_whole(tmp_path):
    layout, config = Layout(tmp_path / "out"), load_config(None)
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    make_plan(source, layout, config)
    before = {p: p.read_bytes() for p in layout.plan_dir.rglob("*") if p.is_file()}
    source.write_bytes(b'[{"id": 1, "conversations": []}, {"id": 2}]')
    with pytest.raises(InputError, match="no record has a usable conversation"):
        make_plan(source, layout, config)
    assert {p: p.read_bytes() for p in layout.plan_dir.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in layout.root.iterdir()) == ["plan"]  # no staging directory left


# --- preprocess.py end to end ---------------------------------------------------------------------

BAD_INPUTS = [
    (None, "input file not found"),
    (b'[\n{"id": 1, "conversations": []},\n{"id": 2, "conversations": [}\n]', "line 3"),
    (b'{"id": 1, "conversations": [{"from": "human", "value": "hi"}]}\n{"id": 2,\n', "line 2"),
    (b"[1, 2, 3]", "found no object"),
    (b'"just a string"', "found no object"),
    (b"[]", "no records"),
    (b'[{"id": 1, "messages": []}]', "no record has a usable conversation"),
    (b'[{"id": 1, "text": "hi"}]', "record 0: record has no 'conversations' or 'messages' list"),
    (
        b'[{"id": 1, "conversations": [{"from": "human", "value": "<image>"}]}]',
        "nothing to speak: the one selected conversation has no turn with speakable text (1 turn skipped",
    ),
]


@pytest.mark.parametrize("content, message", BAD_INPUTS)
def test_preprocess_rejects_bad_input(tmp_path, content, message):
    source = tmp_path / "in.json"
    if content is not None:
        source.write_bytes(content)
    result = preprocess("--input", source, "--output-dir", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_preprocess_rejects_a_config_typo_and_a_directory(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(1))
    result = preprocess("--input", source, "--output-dir", tmp_path / "out", "--set", "text.max_word=5")
    assert result.returncode == 2 and "did you mean 'max_words'" in result.stderr
    result = preprocess("--input", tmp_path, "--output-dir", tmp_path / "out")
    assert result.returncode == 2 and "not a file" in result.stderr
    assert not (tmp_path / "out").exists()


def test_preprocess_runs_on_through_bad_items_and_replans_only_when_needed(tmp_path):
    records = llava_conversations(4) + [
        convo("../../x", "", 7, "Fine words."),
        convo("..\\x", "\x1b[31mred"),
        {"id": "nothing"},
        convo("long", "x " * 60_000, "Short."),
    ]
    source = write_input(tmp_path / "in.jsonl", records, jsonl=True)
    out = tmp_path / "out"
    assert preprocess("--input", source, "--output-dir", out, "--validate").returncode == 0
    assert not out.exists()  # --validate writes nothing
    result = preprocess("--input", source, "--output-dir", out, "--count", "6", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert "segments" in result.stdout and (out / "config.yaml").is_file()
    ids = {c["conversation_id"] for c in plan_conversations(out)}
    assert len(ids) == 6 and all(SAFE.match(i) for i in ids)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out"]  # nothing escaped
    again = preprocess(
        "--input", source, "--output-dir", out, "--count", "6", "--seed", "3", "--set", "workers.per_slot=2"
    )
    assert again.returncode == 0 and "up to date" in again.stderr
    assert "per_slot: 2" in (out / "config.yaml").read_text()
    # synthesis work from this plan blocks a different plan unless forced
    Layout(out).work_dir.mkdir()
    Layout(out).manifest("shard-00000").write_text("{}\n")
    blocked = preprocess("--input", source, "--output-dir", out, "--count", "5")
    assert blocked.returncode == 2 and "--force-replan" in blocked.stderr
    assert "changed since: select.count: 6 -> 5; select.seed: 3 -> 0; use" in blocked.stderr  # --seed not given
    forced = preprocess("--input", source, "--output-dir", out, "--count", "5", "--force-replan")
    assert forced.returncode == 0, forced.stderr
    assert len(plan_conversations(out)) == 5 and not Layout(out).work_dir.exists()
