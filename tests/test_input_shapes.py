"""The shapes of input people bring, read as conversations: OpenAI / LLaMA-Factory `messages`, Alpaca's
instruction / input / output, and any of them gzip'ed or zstd'ed."""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from conftest import DATA, assert_complete, need, preprocess, read_jsonl, run_all, script_env
from convtts.config import load_config
from convtts.plan import reader
from convtts.plan.planner import make_plan
from convtts.plan.reader import InputError
from convtts.state.layout import Layout

# The records hold Chinese turns: the silence voice speaks every language (the default English voice skips them).
ANY_LANGUAGE = ["tts.backend=silence"]
MERGED = {"audio", "language"}  # what conversations.json adds to a record's spoken turns


def planned(out) -> tuple[list[dict], list[dict], list[dict]]:
    """(segment rows, conversation lines, skipped lines) of the plan in `out`."""
    layout = Layout(out)
    rows = [r for s in layout.shard_names() for r in read_jsonl(layout.shard_file(s))]
    conversations = [c for s in layout.shard_names() for c in read_jsonl(layout.shard_conversations(s))]
    return rows, conversations, read_jsonl(layout.skipped_file)


def turn_texts(rows: list[dict]) -> dict[tuple[str, int], str]:
    """{(conversation, turn): the turn's text as planned}, from its first segment's source_text."""
    return {(r["conversation_id"], r["turn"]): r["source_text"] for r in rows if "source_text" in r}


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


# --- messages --------------------------------------------------------------------------------------


def test_messages_records_are_planned_turn_by_turn_with_their_text_parts(tmp_path):
    source = DATA / "messages_style.jsonl"
    records = read_jsonl(source)
    plan = make_plan(source, Layout(tmp_path / "out"), load_config(None, ANY_LANGUAGE))
    rows, conversations, skipped = planned(tmp_path / "out")
    assert plan["conversations"] == len(records) and plan["skipped_records"] == 0
    by_id = {c["conversation_id"]: c["record"] for c in conversations}
    texts = turn_texts(rows)
    spoken = {key[0] for key in texts}
    assert spoken == set(by_id)  # every record spoke
    for cid, record in by_id.items():
        for turn, message in enumerate(record["messages"]):
            if message["role"] == "system":
                assert (cid, turn) not in texts  # not in text.speak_roles by default
                continue
            assert texts[cid, turn] == text_of(message["content"])
            assert "image_url" not in texts[cid, turn] and "COCO_val2014" not in texts[cid, turn]
    assert {r["side"] for r in rows} == {"human", "assistant"}
    systems = [s for s in skipped if s["role"] == "system"]
    assert len(systems) == sum(m["role"] == "system" for r in records for m in r["messages"]) > 0
    assert {s["reason"] for s in systems} == {"role system is not in text.speak_roles"}
    # the record kept is the input's, content parts and all, not the turns read from it
    lines = source.read_bytes().splitlines()
    assert [orjson.dumps(c["record"]) for c in conversations] == [orjson.dumps(orjson.loads(x)) for x in lines]


def test_system_messages_speak_when_speak_roles_has_system(tmp_path):
    config = load_config(None, [*ANY_LANGUAGE, "text.speak_roles=[human,assistant,system]"])
    make_plan(DATA / "messages_style.jsonl", Layout(tmp_path / "out"), config)
    rows, _, skipped = planned(tmp_path / "out")
    assert "system" in {r["side"] for r in rows} and not [s for s in skipped if s["role"] == "system"]


# --- Alpaca ----------------------------------------------------------------------------------------


def test_alpaca_records_speak_instruction_and_input_then_output(tmp_path):
    source = DATA / "alpaca_zh_style.json"
    records = orjson.loads(source.read_bytes())
    assert any(r["input"] for r in records) and any(not r["input"] for r in records)
    plan = make_plan(source, Layout(tmp_path / "out"), load_config(None, ANY_LANGUAGE))
    rows, conversations, _ = planned(tmp_path / "out")
    assert plan["conversations"] == len(records) == len(conversations)
    assert [c["record"] for c in conversations] == records  # the records as they came, in file order
    texts = turn_texts(rows)
    for item in conversations:
        cid, record = item["conversation_id"], item["record"]
        prompt = record["instruction"] + ("\n" + record["input"] if record["input"] else "")
        assert texts[cid, 0] == prompt and texts[cid, 1] == record["output"]
    assert {(r["turn"], r["role"], r["side"]) for r in rows} == {(0, "human", "human"), (1, "gpt", "assistant")}


def test_instruction_output_lines_without_input_are_alpaca_too(tmp_path):
    # LLaVA-Instruct's GPT-4 Q&A file: {"id", "image", "instruction", "output", "type"}, each id three times
    source = DATA / "llava_gpt4_qa_30x3.jsonl"
    records = read_jsonl(source)
    plan = make_plan(source, Layout(tmp_path / "out"), load_config(None, ANY_LANGUAGE))
    rows, conversations, _ = planned(tmp_path / "out")
    assert plan["conversations"] == len(records) == 90
    ids = [c["conversation_id"] for c in conversations]
    assert len(set(ids)) == 90 and ids[:3] == [f"{records[0]['id']}-{n}" for n in (1, 2, 3)]
    texts = turn_texts(rows)
    assert [texts[cid, 0] for cid in ids] == [r["instruction"] for r in records]
    assert [texts[cid, 1] for cid in ids] == [r["output"] for r in records]


BAD_RECORDS = [
    ({"id": 1, "messages": []}, "'messages' is empty"),
    ({"id": 2, "messages": "hello"}, "'messages' is a string, not a list"),
    ({"id": 3, "instruction": "Say hi."}, "Alpaca record's 'output' is null, not a string"),
    ({"id": 4, "instruction": "Say hi.", "input": 5, "output": "Hi."}, "Alpaca record's 'input' is a number"),
    ({"id": 5, "text": "hi"}, "record has no 'conversations' or 'messages' list, nor Alpaca's"),
]


def test_unusable_records_of_each_shape_are_skipped_with_their_reason(tmp_path):
    good = read_jsonl(DATA / "messages_style.jsonl")[:1]
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [*good, *(r for r, _ in BAD_RECORDS)]))
    plan = make_plan(source, Layout(tmp_path / "out"), load_config(None, ANY_LANGUAGE))
    _, _, skipped = planned(tmp_path / "out")
    reasons = {s["source_id"]: s["reason"] for s in skipped if s["turn"] is None}
    assert plan["conversations"] == 1 and plan["skipped_records"] == len(BAD_RECORDS)
    for record, reason in BAD_RECORDS:
        assert reasons[record["id"]].startswith(reason), reasons[record["id"]]


@pytest.mark.parametrize("record", [r for r, _ in BAD_RECORDS])
def test_a_file_of_only_unusable_records_names_the_accepted_shapes(tmp_path, record):
    source = tmp_path / "in.json"
    source.write_bytes(orjson.dumps([record]))
    shapes = "a 'conversations' or 'messages' list, or Alpaca's 'instruction' and 'output'"
    with pytest.raises(InputError, match=shapes):
        make_plan(source, Layout(tmp_path / "out"), load_config(None, ANY_LANGUAGE))


@pytest.mark.e2e
def test_conversations_json_gives_each_shape_its_audio_in_its_own_shape(tmp_path):
    alpaca = orjson.loads((DATA / "alpaca_zh_style.json").read_bytes())
    records = read_jsonl(DATA / "messages_style.jsonl")[:2] + alpaca[:2]
    source = tmp_path / "mixed.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    out = tmp_path / "out"
    result = run_all("--input", source, "--output-dir", out, "--gpus", "cpu:1", "--set", "tts.backend=silence")
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)
    audio = {}
    for row in rows:
        audio.setdefault((row["conversation_id"], row["turn"]), []).append(row["audio"])
    ids = [c["conversation_id"] for c in planned(out)[1]]
    merged = orjson.loads((out / "conversations.json").read_bytes())
    assert len(merged) == len(records)
    for cid, record, given in zip(ids, records, merged):
        if "messages" in record:
            assert [{k: v for k, v in m.items() if k not in MERGED} for m in given["messages"]] == record["messages"]
            assert all(("language" in m) == bool(m["audio"]) for m in given["messages"])
            turns = range(len(record["messages"]))
            assert [m["audio"] for m in given["messages"]] == [audio.get((cid, t), []) for t in turns]
            assert all(bool(m["audio"]) == (m["role"] != "system") for m in given["messages"])
        else:
            assert {k: v for k, v in given.items() if k not in MERGED} == record
            assert set(given["language"]) == {"instruction", "output"}
            assert given["audio"] == {"instruction": audio[cid, 0], "output": audio[cid, 1]}


# --- compressed inputs ----------------------------------------------------------------------------


def compress(data: bytes, kind: str) -> bytes:
    if kind == "gz":
        return gzip.compress(data)
    zstandard = need("zstandard", "zstd")
    return zstandard.ZstdCompressor(level=3).compress(data)


def plain_and_compressed(tmp_path, data: bytes, kind: str, name: str) -> tuple[Path, Path]:
    plain = tmp_path / name
    plain.write_bytes(data)
    packed = tmp_path / f"{name}.{kind}"
    packed.write_bytes(compress(data, kind))
    return plain, packed


SOURCES = ["llava_style.json", "sharegpt_style.jsonl", "messages_style.jsonl", "alpaca_zh_style.json"]


@pytest.mark.parametrize("kind", ["gz", "zst"])
@pytest.mark.parametrize("name", SOURCES)
def test_a_compressed_input_plans_as_its_plain_bytes_do(tmp_path, kind, name):
    plain, packed = plain_and_compressed(tmp_path, (DATA / name).read_bytes(), kind, name)
    config = load_config(None, [*ANY_LANGUAGE, "shards.segments_per_shard=40", "select.fraction=0.8"])
    first = make_plan(plain, Layout(tmp_path / "plain"), config)
    second = make_plan(packed, Layout(tmp_path / "packed"), config)
    assert planned(tmp_path / "plain") == planned(tmp_path / "packed")
    assert first["shards"] == second["shards"] and first["segments"] == second["segments"] > 0
    # the plan knows its input by the file's own bytes, compressed as they are
    assert second["input"]["sha256"] == hashlib.sha256(packed.read_bytes()).hexdigest() != first["input"]["sha256"]


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_compressed_file_is_known_by_its_bytes_not_its_name(tmp_path, kind):
    # compressed under a plain name, in two members or frames one after another (`cat a.gz b.gz`)
    lines = (DATA / "sharegpt_style.jsonl").read_bytes().splitlines(keepends=True)
    source = tmp_path / "conversations.jsonl"
    source.write_bytes(compress(b"".join(lines[:5]), kind) + compress(b"".join(lines[5:]), kind))
    plan = make_plan(source, Layout(tmp_path / "out"), load_config(None, ANY_LANGUAGE))
    assert plan["records"] == len(lines)


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_compressed_array_longer_than_the_read_window_plans_as_the_plain_one(tmp_path, kind):
    # Over 8 MiB decompressed (reader.CHUNK): records across window edges; a tenth chosen, the rest skipped.
    base = orjson.loads((DATA / "llava_style.json").read_bytes())
    records = [{**r, "id": f"{r['id']}-{n}"} for n in range(260) for r in base]
    data = orjson.dumps(records, option=orjson.OPT_INDENT_2)
    assert len(data) > reader.CHUNK
    plain, packed = plain_and_compressed(tmp_path, data, kind, "big.json")
    config = load_config(None, [*ANY_LANGUAGE, "select.fraction=0.1", "shards.segments_per_shard=500"])
    make_plan(plain, Layout(tmp_path / "plain"), config)
    make_plan(packed, Layout(tmp_path / "packed"), config)
    assert planned(tmp_path / "plain") == planned(tmp_path / "packed")


@pytest.mark.parametrize("kind", ["gz", "zst"])
def test_a_cut_off_compressed_input_is_refused_by_name(tmp_path, kind):
    packed = compress((DATA / "llava_style.json").read_bytes(), kind)
    source = tmp_path / f"in.json.{kind}"
    source.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(InputError, match=f"the {'gzip' if kind == 'gz' else 'zstd'} data is damaged or cut off"):
        make_plan(source, Layout(tmp_path / "out"), load_config(None, ANY_LANGUAGE))


def test_an_invalid_line_in_a_compressed_input_names_its_line(tmp_path):
    lines = (DATA / "sharegpt_style.jsonl").read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][:40] + b"\n"
    source = tmp_path / "in.jsonl.gz"
    source.write_bytes(gzip.compress(b"".join(lines)))
    result = preprocess("--input", source, "--output-dir", tmp_path / "out")
    assert result.returncode == 2 and "invalid JSON on line 4" in result.stderr, result.stderr


def test_a_zstd_input_without_zstandard_names_the_extra(tmp_path):
    zstandard = need("zstandard", "zstd")
    source = tmp_path / "in.jsonl.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress((DATA / "sharegpt_style.jsonl").read_bytes()))
    code = (
        "import sys; sys.modules['zstandard'] = None; sys.modules['compression.zstd'] = None\n"
        "from convtts.plan.command import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "--input", str(source), "--output-dir", str(tmp_path / "out")],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "needs the zstandard package (pip install 'convtts[zstd]')" in result.stderr


@pytest.mark.e2e
def test_a_gzipped_input_runs_through_run_all_and_resumes(tmp_path):
    source = tmp_path / "alpaca_zh.json.gz"
    source.write_bytes(gzip.compress((DATA / "alpaca_zh_style.json").read_bytes()))
    out = tmp_path / "out"
    args = ["--input", source, "--output-dir", out, "--gpus", "cpu:1", "--set", "tts.backend=silence"]
    assert (first := run_all(*args)).returncode == 0, first.stderr
    rows = assert_complete(out)
    merged = orjson.loads((out / "conversations.json").read_bytes())
    records = orjson.loads((DATA / "alpaca_zh_style.json").read_bytes())
    assert [{k: v for k, v in c.items() if k not in MERGED} for c in merged] == records
    assert all(c["language"]["instruction"] == "zh" and c["language"]["output"] in ("zh", "en") for c in merged)
    assert sum(len(c["audio"]["instruction"]) + len(c["audio"]["output"]) for c in merged) == len(rows)
    again = run_all(*args)  # the same compressed bytes: the plan stands, nothing is spoken again
    assert again.returncode == 0, again.stderr
    assert orjson.loads((out / "summary.json").read_bytes())["this_run"]["utterances"] == 0
