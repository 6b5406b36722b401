"""Chinese (and other languages) through the plan: each turn's language, segments in characters,
estimates at each language's rate, and voices that speak only their own languages."""

from __future__ import annotations

import re

import orjson
import pytest

from conftest import DATA, assert_complete, read_jsonl, run_all, sharegpt_conversations, write_input
from convtts import language
from convtts.config import ConfigError, load_config
from convtts.language import detect
from convtts.plan.freshness import plan_is_fresh
from convtts.plan.planner import make_plan
from convtts.plan.segments import split_characters
from convtts.speak import voice_languages
from convtts.state.layout import Layout

HAN = re.compile("[\u4e00-\u9fff]")
SENTENCE_MARKS = "。！？!?.…"
CLAUSE_MARKS = "，；、：,;:"
CLOSING = "”’\"'」』）)]"
ANY_VOICE = "tts.backend=silence"  # speaks every language


def chinese_records() -> list[dict]:
    """60 real Chinese instruction and answer pairs (tests/data/README.md)."""
    return orjson.loads((DATA / "alpaca_zh60.json").read_bytes())


def english_records() -> list[dict]:
    """6 real short-answer VQA conversations of LLaVA-1.5 (tests/data/README.md)."""
    return orjson.loads((DATA / "llava15_vqa6.json").read_bytes())


def planned(tmp_path, records: list[dict], *overrides: str) -> tuple[dict, list[dict], list[dict]]:
    """(plan.json, its rows, its skipped turns) of the records under these config overrides."""
    layout = Layout(tmp_path / "out")
    plan = make_plan(write_input(tmp_path / "in.json", records), layout, load_config(None, list(overrides)))
    rows = [row for shard in layout.shard_names() for row in read_jsonl(layout.shard_file(shard))]
    return plan, rows, read_jsonl(layout.skipped_file)


def turns_of(rows: list[dict]) -> dict[tuple, list[str]]:
    turns: dict[tuple, list[str]] = {}
    for row in rows:
        turns.setdefault((row["conversation_id"], row["turn"]), []).append(row["text"])
    return turns


@pytest.fixture(scope="module")
def chinese(tmp_path_factory):
    return planned(tmp_path_factory.mktemp("zh"), chinese_records(), ANY_VOICE)


# --- language -------------------------------------------------------------------------------------


def test_every_row_of_chinese_text_is_tagged_zh(chinese):
    plan, rows, _ = chinese
    chinese_turns = {turn for turn, pieces in turns_of(rows).items() if HAN.search("".join(pieces))}
    assert rows and all(
        row["language"] == "zh" for row in rows if (row["conversation_id"], row["turn"]) in chinese_turns
    )
    english = {row["conversation_id"] for row in rows if row["language"] == "en"}
    assert english == {"alpaca-zh-117"}  # the one answer written in English
    assert plan["languages"] == {"zh": 118, "en": 1}


def test_a_chinese_turn_with_english_words_is_chinese():
    request = chinese_records()[0]["conversations"][0]["value"]  # 计算句子"I want to go for a walk"中的单词数。
    assert "I want to go for a walk" in request and detect(request) == "zh"
    assert detect("The word 你好 means hello, and 谢谢 means thank you.") == "en"


def test_scripts_and_the_model_name_other_languages(monkeypatch):
    russian, french = (sharegpt_conversations()[i]["conversations"][0]["value"] for i in (5, 2))
    assert detect(russian) == "ru" and detect(french) == "fr"  # 'Quelle est la meilleure saison ...': all ASCII
    assert detect("東京は日本の首都です。とても大きな街です。") == "ja"
    assert detect("안녕하세요, 만나서 반갑습니다.") == "ko"
    for short in ("No", "Dakota digital", "No coal no nuclear"):  # too short or doubtful: English
        assert detect(short) == "en"
    monkeypatch.setattr(language, "_HAVE_MODEL", False)  # a broken install without py3langid
    assert detect(russian) == "ru" and detect(french) == "en" and detect("你好，世界。") == "zh"


def test_text_language_overrides_the_test(tmp_path):
    _, rows, _ = planned(tmp_path, chinese_records()[15:20], ANY_VOICE, "text.language=zh")
    assert {row["language"] for row in rows} == {"zh"}
    with pytest.raises(ConfigError, match="text.language"):
        load_config(None, ["text.language=Chinese"])


# --- segments -------------------------------------------------------------------------------------


def test_no_chinese_segment_is_over_the_cap(chinese, tmp_path):
    _, rows, _ = chinese
    lengths = sorted(len(row["text"]) for row in rows if row["language"] == "zh")
    assert lengths[-1] <= 80 and lengths[int(0.95 * len(lengths))] < 100
    assert max(len(turn["value"]) for r in chinese_records() for turn in r["conversations"]) > 400
    _, wide, _ = planned(tmp_path, chinese_records(), ANY_VOICE, "text.max_chars=150")
    assert max(len(row["text"]) for row in wide if row["language"] == "zh") <= 150
    with pytest.raises(ConfigError, match="max_chars"):
        load_config(None, ["text.max_chars=151"])  # the ceiling whatever the settings


def test_a_turn_is_cut_at_sentence_marks_first_then_at_clause_marks(chinese):
    _, rows, _ = chinese
    ends = {"sentence": 0, "clause": 0, "other": 0}
    for pieces in turns_of([row for row in rows if row["language"] == "zh"]).values():
        for piece in pieces[:-1]:
            mark = piece.rstrip(CLOSING)[-1]
            ends["sentence" if mark in SENTENCE_MARKS else "clause" if mark in CLAUSE_MARKS else "other"] += 1
    assert ends["sentence"] > 10 * ends["clause"] > 0 and ends["other"] <= 1, ends


def test_sentences_that_fit_are_kept_whole():
    answer = chinese_records()[46]["conversations"][1]["value"]  # sentences of 20 to 70 characters
    sentences = [s + "。" for s in answer.split("。") if s]
    assert all(len(s) <= 80 for s in sentences) and len(answer) > 160
    pieces = split_characters(answer, 80)
    assert "".join(pieces) == answer
    assert all(piece.endswith("。") for piece in pieces)  # never a clause mark while a sentence fits


def test_a_long_sentence_is_cut_at_its_clauses():
    answer = chinese_records()[19]["conversations"][1]["value"]  # clauses of at most 28 characters
    sentence = re.sub(r"\s", "", answer).replace("。", "，").rstrip("，") + "。"  # one sentence of many clauses
    pieces = split_characters(sentence, 40)
    assert "".join(pieces) == sentence and len(pieces) > 3
    assert all(len(piece) <= 40 and piece.rstrip(CLOSING)[-1] in "，；、：。" for piece in pieces)


def test_an_embedded_english_word_or_number_is_never_cut():
    # A real sentence repeated with no punctuation at all: only the runs' own cuts remain.
    words = "拟人化Anthropomorphism是指一种文学修辞手法在2023年12月被广泛讨论Python3.12也是"
    text = words * 6
    pieces = split_characters(text, 50)
    assert "".join(pieces) == text and all(len(piece) <= 50 for piece in pieces)
    for left, right in zip(pieces, pieces[1:]):
        assert not (left[-1].isascii() and left[-1].isalnum() and right[0].isascii() and right[0].isalnum())
    for token in ("Anthropomorphism", "2023", "Python3.12"):
        assert sum(piece.count(token) for piece in pieces) == 6


def test_japanese_is_cut_at_its_marks_and_korean_keeps_its_spaces():
    japanese = "日本は東アジアに位置する島国である。首都は東京で、人口は約一億二千万人である。公用語は日本語である。"
    assert detect(japanese) == "ja"
    pieces = split_characters(japanese, 40)
    assert "".join(pieces) == japanese and all(piece.endswith("。") for piece in pieces) and len(pieces) == 2
    korean = "대한민국은 동아시아의 한반도 남부에 위치한 민주공화국이다. 수도는 서울특별시이며, 인구는 약 5천만 명이다."
    assert detect(korean) == "ko"
    pieces = split_characters(korean, 40)
    assert " ".join(pieces) == korean and len(pieces) == 2  # a space between sentences, none lost in a word


def test_a_token_longer_than_the_cap_is_still_cut():
    pieces = split_characters("这是一个很长的标识符：" + "x" * 200 + "。", 80)
    assert max(len(piece) for piece in pieces) <= 80


# --- estimates ------------------------------------------------------------------------------------


def test_plan_hours_take_the_chinese_rate(chinese, tmp_path):
    plan, rows, _ = chinese
    chinese_units = sum(row["words"] for row in rows if row["language"] == "zh")
    english_words = sum(row["words"] for row in rows if row["language"] == "en")
    assert plan["estimated_seconds"] == pytest.approx(chinese_units * 60 / 270 + english_words * 60 / 150, abs=0.1)
    faster, _, _ = planned(tmp_path, chinese_records(), ANY_VOICE, "text.chars_per_minute.zh=540")
    assert faster["estimated_seconds"] == pytest.approx(chinese_units * 60 / 540 + english_words * 60 / 150, abs=0.1)
    first = next(row for row in rows if row["conversation_id"] == "alpaca-zh-100")
    assert first["words"] == 9 + 7  # 计算句子 中的单词数: nine characters; "I want to go for a walk": seven words


# --- voices ---------------------------------------------------------------------------------------


def test_each_voice_names_its_languages():
    assert voice_languages(load_config(None)) == {"en"}  # from the Piper voice's own .onnx.json
    assert voice_languages(load_config(None, [ANY_VOICE])) is None
    v1 = voice_languages(load_config(DATA.parents[1] / "configs" / "cosyvoice.yaml"))
    assert {"zh", "en", "ja", "ko", "yue"} <= v1


def test_turns_the_voice_does_not_speak_are_skipped_with_the_reason(tmp_path):
    plan, rows, skipped = planned(tmp_path, english_records() + chinese_records()[:2])
    assert {row["language"] for row in rows} == {"en"} and not any(HAN.search(row["text"]) for row in rows)
    unspoken = [s for s in skipped if s["conversation_id"].startswith("alpaca")]
    assert len(unspoken) == 4 and all(s["reason"] == "language zh: the voice speaks en" for s in unspoken)
    assert plan["skipped_languages"] == {"zh": 4}


def test_another_voice_makes_the_plan_stale(tmp_path):
    source = write_input(tmp_path / "in.json", english_records() + chinese_records()[:2])
    layout = Layout(tmp_path / "out")
    make_plan(source, layout, load_config(None))
    assert plan_is_fresh(source, layout, load_config(None))
    assert not plan_is_fresh(source, layout, load_config(None, [ANY_VOICE]))  # it speaks the Chinese turns


# --- whole runs -----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_the_english_voice_refuses_a_chinese_input(tmp_path):
    out = tmp_path / "out"
    result = run_all("--input", DATA / "alpaca_zh60.json", "--output-dir", out, "--gpus", "cpu:1")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "Chinese (zh)" in errors[0] and "speaks en only" in errors[0] and "configs/cosyvoice.yaml" in errors[0]
    assert not (out / "work").exists() and not (out / "audio").exists()


@pytest.mark.e2e
def test_a_mixed_input_speaks_its_english_turns_and_skips_the_chinese(tmp_path):
    records = english_records()[:4] + chinese_records()[:2]
    source = write_input(tmp_path / "mixed.json", records)
    out = tmp_path / "out"
    result = run_all("--input", source, "--output-dir", out, "--gpus", "cpu:1")
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)
    assert len({row["conversation_id"] for row in rows}) == 4
    assert all(row["language"] == "en" and not HAN.search(row["text"]) for row in rows)
    failures = read_jsonl(out / "failures.jsonl")
    unspoken = [f for f in failures if f.get("reason") == "language zh: the voice speaks en"]
    assert len(unspoken) == 4 and {f["conversation_id"] for f in unspoken} == {"alpaca-zh-100", "alpaca-zh-101"}
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["skipped_languages"] == {"zh": 4}
    assert "4 in zh: the voice does not speak it" in result.stdout
    conversations = {c["id"]: c for c in orjson.loads((out / "conversations.json").read_bytes())}
    assert all(turn["audio"] == [] for turn in conversations["alpaca-zh-100"]["conversations"])
    assert all(t["language"] == "en" and t["audio"] for t in conversations["gqa-201307251"]["conversations"])
