"""The sample files through preprocess.py: odd ids, skipped turns, cleaning, other languages, one-letter answers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from conftest import DATA, REPO, llava_conversations, read_jsonl, script_env, sharegpt_conversations
from convtts.plan.textclean import clean
from convtts.state.layout import Layout

SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
HASH = r"-[0-9a-f]{8}"  # appended whenever an id had to be changed to be a safe file name
UNSPOKEN_ROLE = "role system is not in text.speak_roles"


def planned(source: Path, out: Path, *args: str) -> dict:
    """Run preprocess.py on `source`: the plan, its conversations, segment rows and skipped lines."""
    result = subprocess.run(
        [sys.executable, str(REPO / "preprocess.py"), "--input", str(source), "--output-dir", str(out), *args],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    layout = Layout(out)
    shards = layout.shard_names()
    return {
        "plan": orjson.loads(layout.plan_file.read_bytes()),
        "conversations": [c for s in shards for c in read_jsonl(layout.shard_conversations(s))],
        "rows": [r for s in shards for r in read_jsonl(layout.shard_file(s))],
        "skipped": read_jsonl(layout.skipped_file),
    }


@pytest.fixture(scope="module")
def sharegpt(tmp_path_factory) -> dict:
    # The silence voice speaks every language: the default one (English) skips the French, Russian and
    # Chinese turns (tests/test_chinese.py)
    out = tmp_path_factory.mktemp("sharegpt") / "out"
    return planned(DATA / "sharegpt_style.jsonl", out, "--set", "tts.backend=silence")


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> dict:
    return planned(DATA / "llava_style.json", tmp_path_factory.mktemp("llava") / "out")


def segments(planned: dict, cid: str, turn: int) -> list[str]:
    return [r["text"] for r in planned["rows"] if r["conversation_id"] == cid and r["turn"] == turn]


def spoken(planned: dict, cid: str, turn: int) -> str:
    """One turn as it will be spoken: its segments joined back together."""
    return " ".join(segments(planned, cid, turn))


def letters(text: str) -> list[str]:
    return [c for c in text if c.isalpha()]


def cid_of(planned: dict, source_id) -> str:
    (cid,) = [c["conversation_id"] for c in planned["conversations"] if c["record"].get("id") == source_id]
    return cid


# --- ids and skipped turns -----------------------------------------------------------------------


def test_odd_ids_become_unique_safe_file_names(sharegpt):
    conversations = sharegpt["conversations"]
    assert [c["record"] for c in conversations] == [r for r in sharegpt_conversations() if r["conversations"]]
    ids = [c["conversation_id"] for c in conversations]
    # spaces, slashes, unicode, a number, a repeated id, no id, ':' and '#', a '../' path, a dotted id
    expected = [
        rf"conv_7{HASH}",
        rf"team_alpha_12{HASH}",
        rf"_ber-_-__{HASH}",
        "4021",
        "dup-case-1",
        "dup-case-2",
        r"auto-[0-9a-f]{16}",
        rf"chat_2024-05-01__3{HASH}",
        rf"_escape-attempt{HASH}",
        r"translate\.v2",
    ]
    assert len(ids) == len(expected) and all(re.fullmatch(p, cid) for p, cid in zip(expected, ids)), ids
    assert len(set(ids)) == len(ids)
    names = [r["id"] for r in sharegpt["rows"]] + [s["id"] for s in sharegpt["skipped"]]
    assert len(set(names)) == len(names) and all(SAFE.match(n) for n in names)
    source = {c["conversation_id"]: c["record"].get("id") for c in conversations}
    for row in sharegpt["rows"]:  # audio is named after the row id, which starts with its conversation's
        assert row["id"].startswith(row["conversation_id"] + "-") and row["source_id"] == source[row["conversation_id"]]


def test_empty_code_only_and_unspoken_turns_are_skipped_with_a_reason(sharegpt):
    chat, code, escape = (cid_of(sharegpt, i) for i in ("chat:2024-05-01 #3", "conv 7", "../escape-attempt"))
    reasons = {s["id"]: s["reason"] for s in sharegpt["skipped"]}
    assert reasons == {
        f"{chat}-000": "empty",
        f"{chat}-001": "empty",
        f"{chat}-004": "empty",  # "", spaces and a tab, newlines
        f"{code}-002": "only code",
        "4021-000": UNSPOKEN_ROLE,
        f"{escape}-002": UNSPOKEN_ROLE,
        "record-10": "'conversations' is empty",
    }
    assert all(s["status"] == "skipped" for s in sharegpt["skipped"])
    plan = sharegpt["plan"]
    assert (plan["records"], plan["skipped_records"], plan["conversations"], plan["skipped_turns"]) == (11, 1, 10, 6)
    assert sorted({r["turn"] for r in sharegpt["rows"] if r["conversation_id"] == chat}) == [2, 3, 5]
    assert spoken(sharegpt, code, 3).startswith("That prints minus 40.0:")  # the reply to the skipped code is spoken


# --- cleaning ------------------------------------------------------------------------------------


def test_code_blocks_links_and_markdown_are_removed_and_numbers_kept(sharegpt):
    code = spoken(sharegpt, cid_of(sharegpt, "conv 7"), 1)
    assert code.startswith(
        "Multiply the Celsius value by 9 over 5 and add 32. Here is a small function that does it, as"
    )
    assert "20°C becomes 68°F, and the boiling point of water, 100°C, becomes 212°F." in code
    assert not any(gone in code for gone in ("`", "def ", "return", "print", "https", "docs.python.org"))
    assert "The tutorial at python dot org explains" in code  # a link is said as its domain

    advice = spoken(sharegpt, "4021", 2)
    assert "The sleep hygiene checklist has more ideas" in advice  # a markdown link keeps its words
    assert "example.org" not in advice and "](" not in advice and "*" not in advice
    assert "1. Keep a regular schedule. Going to bed" in advice  # a list item ends in a full stop

    packs = cid_of(sharegpt, "team/alpha/12")
    text = " ".join(spoken(sharegpt, packs, turn) for turn in range(4))
    for kept in (
        "3.5 kg",
        "89 dollars and 99 cents",
        "129 dollars",
        "39 dollars and 1 cent",
        "2.3 kg",
        "50 percent",
        "1,024 ml",
        "25°C",
        "50 to 65 liters",
    ):
        assert kept in text
    assert "Weight adds up. Saving 2.3 kg" in text and "*" not in text and " - " not in text


def test_a_long_answer_is_split_at_sentences_without_losing_a_word(sharegpt):
    cid = cid_of(sharegpt, "../escape-attempt")
    answer = sharegpt_conversations()[8]["conversations"][1]["value"]
    pieces = segments(sharegpt, cid, 1)
    assert len(answer.split()) > 150 and len(pieces) >= 6
    assert " ".join(pieces) == clean(answer)[0]
    assert all(len(p.split()) <= 30 for p in pieces)
    assert sum(p.endswith((".", ",")) for p in pieces) >= len(pieces) - 2  # mostly whole sentences or clauses


def test_other_languages_are_spoken_as_written(sharegpt):
    """A voice of every language: French, Russian, Chinese and Japanese turns keep every letter, in order."""
    by_language = {"French": 2, "Russian": 5, "Chinese": 6, "Japanese": 9}
    for language, index in by_language.items():
        conversation = sharegpt["conversations"][index]
        for number, turn in enumerate(conversation["record"]["conversations"]):
            text = spoken(sharegpt, conversation["conversation_id"], number)
            assert text and letters(text) == letters(turn["value"]), (language, number)
    french, russian, chinese = (sharegpt["conversations"][i]["conversation_id"] for i in (2, 5, 6))
    assert "été" in spoken(sharegpt, french, 1) and "游泳" in spoken(sharegpt, chinese, 1)
    tea = segments(sharegpt, russian, 1)  # 36 words: split where a Russian sentence ends
    assert len(tea) == 2 and all(p.endswith(".") for p in tea)


def test_one_letter_answers_are_kept(sharegpt):
    rows = [r for r in sharegpt["rows"] if r["conversation_id"] == "dup-case-1"]
    assert [(r["turn"], r["text"], r["words"]) for r in rows if r["side"] == "assistant"] == [(1, "B", 1), (3, "A", 1)]
    question = spoken(sharegpt, "dup-case-1", 0)
    assert question.startswith("Which planet is known as the Red Planet?") and "B. Mars." in question


# --- the LLaVA-style file ------------------------------------------------------------------------


def test_image_placeholders_before_or_after_the_question_are_not_spoken(llava):
    firsts = [r for r in llava["rows"] if r["turn"] == 0]
    assert [r["conversation_id"] for r in firsts] == [r["id"] for r in llava_conversations()]
    assert any(r["source_text"].startswith("<image>\n") for r in firsts)
    assert any(r["source_text"].endswith("\n<image>") for r in firsts)
    assert all(r["text"] == r["source_text"].replace("<image>", "").strip() for r in firsts)
    assert llava["plan"]["skipped_turns"] == 0 and llava["plan"]["conversations"] == 30


def test_long_answers_lists_and_units_in_the_llava_file(llava):
    long_answers = [
        (r["id"], n)
        for r in llava_conversations()
        for n, t in enumerate(r["conversations"])
        if len(t["value"].split()) >= 150
    ]
    assert len(long_answers) >= 5
    assert all(len(segments(llava, cid, n)) >= 5 for cid, n in long_answers)
    texts = " ".join(r["text"] for r in llava["rows"])
    assert "*" not in texts and all(r["words"] <= 30 for r in llava["rows"])
    assert "1. Clean and oil the chain. A dirty chain" in texts  # '1. **Clean and oil the chain.** A dirty ...'
    for kept in (
        "12 dollars and 99 cents",
        "3.5 kg",
        "50 percent",
        "20°C",
        "minus 20°C",
        "1,500",
        "8,000",
        "€1.80",
        "6.4 kW",
        "06:45",
    ):
        assert kept in texts
