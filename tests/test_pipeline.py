"""End-to-end runs of run_all.sh with the real Piper voice on CPU slots: outputs, reruns, exit codes."""

from __future__ import annotations

import fcntl

import orjson
import pytest

from conftest import assert_complete, llava_conversations, plan_ids, read_jsonl, run_all, script_env, write_input

pytestmark = pytest.mark.e2e

SMALL_SHARDS = "shards.segments_per_shard=8"


@pytest.mark.slow
def test_end_to_end_two_cpu_slots(tmp_path, small_input):
    out = tmp_path / "out"
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        out,
        "--gpus",
        "cpu:2",
        "--set",
        SMALL_SHARDS,
        "--log-dir",
        tmp_path / "log",
    )
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)
    plan = orjson.loads((out / "plan" / "plan.json").read_bytes())
    assert len(rows) == plan["segments"] and len(plan["shards"]) >= 4
    row = rows[0]
    for key in (
        "id",
        "conversation_id",
        "turn",
        "role",
        "speaker",
        "text",
        "source_text",
        "audio",
        "duration",
        "sample_rate",
        "backend",
    ):
        assert key in row
    assert row["backend"] == "piper" and row["sample_rate"] == 22050
    # by_role: within a conversation the two sides speak with different voices
    for cid in {r["conversation_id"] for r in rows}:
        voices = {(r["side"], r["speaker"]) for r in rows if r["conversation_id"] == cid}
        assert len({v for _, v in voices}) == 2 and len(voices) == 2
    # the first human turn is only a question after the <image> placeholder: it is spoken without it
    assert all("<image>" not in r["text"] for r in rows)

    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["done"] == len(rows) and summary["failed"] == 0 and summary["complete"]
    assert summary["audio_seconds"] > 0 and summary["this_run"]["real_time_factor"] > 0
    conversations = orjson.loads((out / "conversations.json").read_bytes())
    assert [c["id"] for c in conversations] == [r["id"] for r in llava_conversations(4)]
    spoken = [a for c in conversations for t in c["conversations"] for a in t["audio"]]
    assert sorted(spoken) == sorted(r["audio"] for r in rows)
    assert conversations[0]["image"]  # other fields are kept
    assert (out / "config.yaml").is_file()
    logs = sorted(p.name for p in (tmp_path / "log").rglob("slot-?.log"))
    assert logs == ["slot-0.log", "slot-1.log"]
    assert "audio" in result.stdout and "failed" in result.stdout  # the closing summary

    # A second run on the finished output does nothing and exits 0.
    before = {p: p.stat().st_mtime_ns for p in (out / "audio").rglob("*.wav")}
    again = run_all(
        "--input",
        small_input,
        "--output-dir",
        out,
        "--gpus",
        "cpu:2",
        "--set",
        SMALL_SHARDS,
        "--log-dir",
        tmp_path / "log",
    )
    assert again.returncode == 0, again.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "audio").rglob("*.wav")} == before
    assert read_jsonl(out / "manifest.jsonl") == rows
    assert orjson.loads((out / "summary.json").read_bytes())["this_run"]["utterances"] == 0


def test_failed_utterances_exit_1_and_rerun_retries_them(tmp_path):
    records = llava_conversations(1)
    records[0]["conversations"][1]["value"] = "The zebra is grazing quietly. " + records[0]["conversations"][1]["value"]
    source = write_input(tmp_path / "in.jsonl", records, jsonl=True)
    out = tmp_path / "out"
    args = (
        "--input",
        source,
        "--output-dir",
        out,
        "--gpus",
        "cpu:1",
        "--workers",
        "2",
        "--set",
        "tts.backend=flaky_backend:FlakyPiper",
        "--set",
        "workers.max_attempts=2",
    )
    failing = script_env(CONVTTS_TEST_FAIL_WORD="zebra")
    first = run_all(*args, env=failing)
    assert first.returncode == 1, first.stderr
    failures = [f for f in read_jsonl(out / "failures.jsonl") if f["status"] == "failed"]
    assert len(failures) == 1 and "zebra" in failures[0]["text"]
    assert failures[0]["attempts"] == 2 and "refusing" in failures[0]["reason"]
    spoken = read_jsonl(out / "manifest.jsonl")
    assert failures[0]["id"] not in {r["id"] for r in spoken} and len(spoken) > 3

    second = run_all(*args, env=script_env())  # the cause is gone: the same command finishes the work
    assert second.returncode == 0, second.stderr
    rows = assert_complete(out)
    assert [r for r in read_jsonl(out / "failures.jsonl") if r["status"] != "skipped"] == []
    redone = [r for r in rows if r["run"] != spoken[0]["run"]]
    assert [r["id"] for r in redone] == [failures[0]["id"]]


def test_segfaulting_utterance_costs_only_itself(tmp_path):
    records = llava_conversations(1)
    records[0]["conversations"][3]["value"] = "A walrus appears. " + records[0]["conversations"][3]["value"]
    source = write_input(tmp_path / "in.json", records)
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
        "tts.backend=flaky_backend:FlakyPiper",
        "--log-dir",
        tmp_path / "log",
        env=script_env(CONVTTS_TEST_CRASH_WORD="walrus"),
    )
    assert result.returncode == 1, result.stderr
    failed = [f for f in read_jsonl(out / "failures.jsonl") if f["status"] == "failed"]
    assert len(failed) == 1 and "walrus" in failed[0]["text"] and "died" in failed[0]["reason"]
    crashes = [c for p in (out / "work").glob("*.crashes.jsonl") for c in read_jsonl(p)]
    assert len(crashes) == 3 and {c["id"] for c in crashes} == {failed[0]["id"]}
    assert all(c["exitcode"] == -11 for c in crashes)
    spoken = read_jsonl(out / "manifest.jsonl")
    assert sorted(r["id"] for r in spoken) == sorted(set(plan_ids(out)) - {failed[0]["id"]})
    slot_log = next((tmp_path / "log").rglob("slot-0.log")).read_text()
    assert "died" in slot_log


def test_lock_held_exits_3_and_touches_nothing(tmp_path, small_input):
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = run_all("--input", small_input, "--output-dir", out, "--gpus", "cpu:1")
    assert result.returncode == 3
    assert "lock" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_bad_input_exits_2_before_writing(tmp_path, small_input):
    cases = {
        "missing": ("--input", tmp_path / "nope.json"),
        "typo": ("--input", small_input, "--set", "workers.per_slott=2"),
        "bad option": ("--input", small_input, "--gpus", "gpu0"),
        "no input": (),
    }
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('[{"conversations": [{"from": "human", "value": "hi"}]},\n {"conversations": [}\n]')
    cases["invalid json"] = ("--input", bad_json)
    not_records = write_input(tmp_path / "numbers.json", [1, 2, 3])
    cases["not records"] = ("--input", not_records)
    no_conversations = write_input(tmp_path / "noconv.json", [{"id": 1, "text": "hello"}])
    cases["no conversations"] = ("--input", no_conversations)
    for name, args in cases.items():
        out = tmp_path / f"out-{name.replace(' ', '-')}"
        result = run_all("--gpus", "cpu:1", "--output-dir", out, *args)  # a case's own --gpus comes last and wins
        assert result.returncode == 2, (name, result.stderr)
        assert result.stderr.strip(), name
        assert not out.exists(), f"{name}: output directory was created"
    assert "line 2" in run_all("--input", bad_json, "--output-dir", tmp_path / "o", "--gpus", "cpu:1").stderr
