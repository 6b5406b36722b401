"""The plan and manifest grow with the text (a turn's source text once), outputs of plan versions 1 and 2
resume, and the plan knows its input by content: touched or moved, it resumes; changed, it is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import orjson
import pytest

from conftest import (
    assert_complete,
    llava_conversations,
    preprocess,
    read_jsonl,
    run_all,
    script_env,
    write_input,
)
from convtts.config import load_config
from convtts.plan.freshness import PLAN_VERSION, fingerprint, rules_digest
from convtts.plan.planner import make_plan
from convtts.state.layout import Layout

SETTINGS = ("tts.backend=silence", "shards.segments_per_shard=8")


def test_a_long_turn_is_stored_once_in_the_plan(tmp_path):
    # One answer of 3000 words: 100 segments of 30. Repeating it on each would make the plan 50x the input.
    answer = " ".join(f"Sentence number {i} says something plain about the picture." for i in range(300))
    record = {
        "id": "long",
        "conversations": [{"from": "human", "value": "Describe it."}, {"from": "gpt", "value": answer}],
    }
    source = write_input(tmp_path / "in.jsonl", [record], jsonl=True)
    layout = Layout(tmp_path / "out")
    plan = make_plan(source, layout, load_config(None))
    rows = [row for shard in plan["shards"] for row in read_jsonl(layout.shard_file(shard))]
    assert len(rows) > 90
    assert [r["source_text"] for r in rows if "source_text" in r] == ["Describe it.", answer]
    assert all(r["segment"] == 0 for r in rows if "source_text" in r)
    plan_bytes = sum(p.stat().st_size for p in layout.shards_dir.iterdir())
    assert plan_bytes < 4 * source.stat().st_size  # the record, its segments' text, the turn once


def as_version_1(out, source):
    """Rewrite an output the way convtts wrote it under plan version 1: every segment, in the plan and
    in the work manifests, repeats its turn's source text; plan.json says version 1."""
    layout = Layout(out)
    turns = {}
    for shard in layout.shard_names():
        for item in read_jsonl(layout.shard_conversations(shard)):
            for number, turn in enumerate(item["record"]["conversations"]):
                turns[item["conversation_id"], number] = turn["value"]
    files = [layout.shard_file(s) for s in layout.shard_names()] + sorted(layout.work_dir.glob("*.manifest.jsonl"))
    for path in files:
        rows = read_jsonl(path)
        for row in rows:
            row["source_text"] = turns[row["conversation_id"], row["turn"]]
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    plan = orjson.loads(layout.plan_file.read_bytes())
    config = load_config(None, list(SETTINGS))
    plan.update(version=1, fingerprint=fingerprint(source, config, version=1))
    layout.plan_file.write_bytes(orjson.dumps(plan))
    return turns


@pytest.mark.e2e
def test_an_output_of_plan_version_1_finishes_without_redoing_spoken_work(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    out = tmp_path / "out"
    args = ["--input", source, "--output-dir", out, "--gpus", "cpu:1", "--log-dir", tmp_path / "log"]
    for setting in SETTINGS:
        args += ["--set", setting]
    assert run_all(*args).returncode == 0
    first = assert_complete(out)
    # Half the work undone, as if the old version had been stopped midway: its rows and audio go.
    layout = Layout(out)
    kept = {r["id"] for r in first[::2]}
    for path in layout.work_dir.glob("*.manifest.jsonl"):
        rows = [r for r in read_jsonl(path) if r["id"] in kept]
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    for row in first:
        if row["id"] not in kept:
            (out / row["audio"]).unlink()
    for stats in layout.work_dir.glob("*.stats.json"):
        stats.unlink()
    turns = as_version_1(out, source)
    before = {p: p.stat().st_mtime_ns for p in layout.audio_root.rglob("*.wav")}

    again = run_all(*args)
    assert again.returncode == 0, again.stderr
    rows = assert_complete(out)
    assert orjson.loads(layout.plan_file.read_bytes())["version"] == PLAN_VERSION
    assert {p: p.stat().st_mtime_ns for p in before} == before  # the kept audio was not spoken again
    assert sorted(r["id"] for r in rows if r["run"] != first[0]["run"]) == sorted({r["id"] for r in first} - kept)
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["this_run"]["utterances"] == len(first) - len(kept)
    for row in rows:  # old and new rows alike: the turn's text on its first segment only
        expected = turns[row["conversation_id"], row["turn"]] if row["segment"] == 0 else None
        assert row["source_text"] == expected, row["id"]


def as_version_2(layout: Layout, source, config) -> None:
    """plan.json as convtts wrote it under plan version 2: the input known by path, size and mtime."""
    plan = orjson.loads(layout.plan_file.read_bytes())
    plan["input"].pop("sha256")
    plan.update(version=2, fingerprint=fingerprint(source, config, version=2))
    layout.plan_file.write_bytes(orjson.dumps(plan))


def planned_with_work(tmp_path):
    """A plan of three conversations and a work manifest spoken for it: (input, layout, config, manifest)."""
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    layout, config = Layout(tmp_path / "out"), load_config(None, list(SETTINGS))
    make_plan(source, layout, config)
    layout.work_dir.mkdir()
    work = layout.manifest("shard-00000", "w0")
    work.write_text('{"id": "spoken-before"}\n')
    return source, layout, config, work


def preprocess_args(source, layout) -> list:
    return ["--input", source, "--output-dir", layout.root, *(x for s in SETTINGS for x in ("--set", s))]


def test_an_output_of_plan_version_2_is_remade_with_its_work_kept(tmp_path):
    source, layout, config, work = planned_with_work(tmp_path)
    args = preprocess_args(source, layout)

    as_version_2(layout, source, config)
    kept = preprocess(*args)
    assert kept.returncode == 0, kept.stderr
    # Version 2 is older than SAME_IDS_SINCE: the plan made now is compared with it shard by shard.
    assert "has the same shards, so the work spoken for them is kept" in kept.stderr and work.read_text()
    assert orjson.loads(layout.plan_file.read_bytes())["version"] == PLAN_VERSION

    # Touched, the input no longer matches an old plan's fingerprint: the plan made now is compared
    # with it, shard by shard, and the same shards keep the work.
    as_version_2(layout, source, config)
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 60_000_000_000))
    touched = preprocess(*args)
    assert touched.returncode == 0, touched.stderr
    assert "has the same shards, so the work spoken for them is kept" in touched.stderr
    assert orjson.loads(layout.plan_file.read_bytes())["version"] == PLAN_VERSION and work.read_text()

    # Changed, it makes other shards: refused, naming run_all.sh's and preprocess.py's flag, the old plan kept.
    as_version_2(layout, source, config)
    old_plan = layout.plan_file.read_bytes()
    write_input(source, llava_conversations(4))
    refused = preprocess(*args)
    assert refused.returncode == 2 and "holds synthesis work" in refused.stderr
    assert set(re.findall(r"--[a-z][a-z-]*", refused.stderr)) == {"--output-dir", "--force-replan"}
    assert work.read_text() == '{"id": "spoken-before"}\n' and layout.plan_file.read_bytes() == old_plan


@pytest.mark.e2e
def test_a_touched_or_moved_input_resumes_and_a_changed_one_is_refused(tmp_path):
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    out = tmp_path / "out"
    settings = [x for s in SETTINGS for x in ("--set", s)]
    first = run_all("--input", source, "--output-dir", out, "--gpus", "cpu:1", *settings)
    assert first.returncode == 0, first.stderr
    stamps = {p: p.stat().st_mtime_ns for p in (out / "audio").rglob("*.wav")}
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 60_000_000_000))  # touch
    copy = tmp_path / "checkout-copy" / "conversations.json"
    copy.parent.mkdir()
    copy.write_bytes(source.read_bytes())

    for path in (source, copy):
        again = run_all("--input", path, "--output-dir", out, "--gpus", "cpu:1", *settings)
        assert again.returncode == 0, again.stderr
        assert orjson.loads((out / "summary.json").read_bytes())["this_run"]["utterances"] == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "audio").rglob("*.wav")} == stamps  # nothing spoken again

    write_input(source, llava_conversations(4))
    refused = run_all("--input", source, "--output-dir", out, "--gpus", "cpu:1", *settings)
    assert refused.returncode == 2 and "holds synthesis work" in refused.stderr
    assert set(re.findall(r"--[a-z][a-z-]*", refused.stderr)) == {"--output-dir", "--force-replan"}
    assert {p: p.stat().st_mtime_ns for p in (out / "audio").rglob("*.wav")} == stamps  # nothing deleted


# preprocess.py with the cleaner changed: every spoken text ends in "Truly." (a rule that says more)
WITH_OTHER_RULES = """
import sys
import convtts.plan.conversation as conversation
cleaned = conversation.clean
conversation.clean = lambda *a, **k: (lambda text, reason: (text and text + " Truly.", reason))(*cleaned(*a, **k))
from convtts.plan.command import main
sys.exit(main(sys.argv[1:]))
"""


def with_other_rules(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITH_OTHER_RULES, *map(str, args)], env=script_env(), capture_output=True, text=True
    )


def test_a_plan_made_by_other_text_rules_is_never_kept(tmp_path):
    """A cleaner that says more (no version raised by hand): the plan it made reads as stale to the
    shipped rules, which remake it; the texts differ, so the work is kept and the rerun refused,
    naming the text rules; with the changed rules back, the plan and its work are as they were."""
    source = write_input(tmp_path / "in.json", llava_conversations(3))
    layout = Layout(tmp_path / "out")
    args = preprocess_args(source, layout)
    other = with_other_rules(*args)
    assert other.returncode == 0, other.stderr
    made_by = orjson.loads(layout.plan_file.read_bytes())["rules"]
    assert made_by != rules_digest(load_config(None, list(SETTINGS)))
    texts = [r["text"] for s in layout.shard_names() for r in read_jsonl(layout.shard_file(s))]
    assert sum(t.endswith(" Truly.") for t in texts) >= 3  # each turn's last segment
    layout.work_dir.mkdir()
    work = layout.manifest("shard-00000", "w0")
    work.write_text('{"id": "spoken-before"}\n')
    old_plan = layout.plan_file.read_bytes()

    refused = preprocess(*args)
    assert refused.returncode == 2, refused.stderr
    assert f"text rules: {made_by} -> " in refused.stderr and "--force-replan" in refused.stderr
    assert layout.plan_file.read_bytes() == old_plan and work.read_text()

    same = with_other_rules(*args)
    assert same.returncode == 0 and "is up to date" in same.stderr, same.stderr
    replanned = preprocess(*args, "--force-replan")
    assert replanned.returncode == 0, replanned.stderr
    assert not any(r["text"].endswith(" Truly.") for r in read_jsonl(layout.shard_file("shard-00000")))


def test_a_plan_of_other_text_rules_with_the_same_shards_keeps_its_work(tmp_path):
    """Rules that changed what the canary says but not this input's segments: the plan is remade and
    the work spoken for it kept (every shard holds the same ids, texts and voices)."""
    source, layout, config, work = planned_with_work(tmp_path)
    plan = orjson.loads(layout.plan_file.read_bytes())
    plan["rules"] = "0" * 16  # the digest of rules that said the canary otherwise
    plan["fingerprint"] = "0" * 64
    layout.plan_file.write_bytes(orjson.dumps(plan))
    args = preprocess_args(source, layout)
    kept = preprocess(*args)
    assert kept.returncode == 0, kept.stderr
    assert "is of other text rules" in kept.stderr and "the work spoken for them is kept" in kept.stderr
    assert work.read_text() and orjson.loads(layout.plan_file.read_bytes())["rules"] == rules_digest(config)


def test_a_plan_of_version_4_is_remade_with_its_work_kept(tmp_path):
    """Plans of version 4 carry no rules digest; their ids and texts are today's (SAME_IDS_SINCE)."""
    source, layout, config, work = planned_with_work(tmp_path)
    plan = orjson.loads(layout.plan_file.read_bytes())
    del plan["rules"]
    plan.update(version=4, fingerprint=fingerprint(source, config, version=4))
    layout.plan_file.write_bytes(orjson.dumps(plan))
    args = preprocess_args(source, layout)
    kept = preprocess(*args)
    assert kept.returncode == 0, kept.stderr
    assert "in the format of plan version 4" in kept.stderr and work.read_text()
    assert orjson.loads(layout.plan_file.read_bytes())["version"] == PLAN_VERSION
