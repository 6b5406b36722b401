"""Voices by language: each turn is cast among the voices of its language (speakers.by_language, or
the language each voice says it speaks), on real Chinese and English conversations."""

from __future__ import annotations

import orjson
import pytest

from conftest import DATA, read_jsonl, write_input
from convtts.config import ConfigError, load_config
from convtts.plan.freshness import plan_settings
from convtts.plan.planner import make_plan
from convtts.plan.voices import casting_for
from convtts.state.layout import Layout

ANY_VOICE = "tts.backend=silence"  # speaks every language, so no turn is skipped for its language


def mixed_records() -> list[dict]:
    """Real conversations of both languages (tests/data/README.md), and ones whose turns alternate."""
    chinese = orjson.loads((DATA / "alpaca_zh60.json").read_bytes())[:12]
    english = orjson.loads((DATA / "llava15_vqa6.json").read_bytes())
    alternating = [
        {"id": f"mixed{i}", "conversations": [zh["conversations"][0], en["conversations"][1], zh["conversations"][1]]}
        for i, (zh, en) in enumerate(zip(chinese, english))
    ]
    return chinese + english + alternating


def plan_rows(tmp_path, *overrides: str) -> list[dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    layout = Layout(tmp_path / "out")
    make_plan(write_input(tmp_path / "in.json", mixed_records()), layout, load_config(None, [ANY_VOICE, *overrides]))
    return [row for shard in layout.shard_names() for row in read_jsonl(layout.shard_file(shard))]


def voices_of(rows: list[dict]) -> dict[str, set[str]]:
    voices: dict[str, set[str]] = {}
    for row in rows:
        voices.setdefault(row["language"], set()).add(row["speaker"])
    return voices


def test_built_in_speakers_speak_the_language_their_names_say(tmp_path):
    rows = plan_rows(tmp_path, "speakers.voices=[中文女, 中文男, 英文女, 英文男]")
    assert voices_of(rows) == {"zh": {"中文女", "中文男"}, "en": {"英文女", "英文男"}}
    # a conversation of both languages: each side keeps one voice a language, the two sides apart
    sides: dict[tuple, set[str]] = {}
    for row in rows:
        if row["conversation_id"].startswith("mixed"):
            sides.setdefault((row["conversation_id"], row["side"], row["language"]), set()).add(row["speaker"])
    assert sides and all(len(voices) == 1 for voices in sides.values())
    for (cid, side, lang), voices in sides.items():
        other = sides.get((cid, "assistant" if side == "human" else "human", lang))
        assert other is None or other != voices, (cid, lang)


def test_by_language_names_the_voices_each_language_takes(tmp_path):
    rows = plan_rows(
        tmp_path,
        "speakers.voices=[anna, ben, lin, mei]",
        "speakers.by_language={zh: [lin, mei], en: [anna]}",
        "speakers.assistant=[ben, mei]",
    )
    assert voices_of(rows) == {"zh": {"lin", "mei"}, "en": {"anna"}}
    zh_assistant = {row["speaker"] for row in rows if row["language"] == "zh" and row["side"] == "assistant"}
    assert zh_assistant == {"mei"}  # the side's own restriction holds within its language
    en_assistant = {row["speaker"] for row in rows if row["language"] == "en" and row["side"] == "assistant"}
    assert en_assistant == {"anna"}  # the side allows no voice of the language's: the language's voices win


def test_a_voice_pool_says_each_voices_language(tmp_path):
    pool = tmp_path / "voices.jsonl"
    lines = [{"name": n, "audio": f"{n}.wav", "text": "t", "language": lang} for n, lang in
             [("a", "zh"), ("b", "zh"), ("c", "en"), ("d", "en"), ("e", "")]]  # fmt: skip
    pool.write_bytes(b"\n".join(orjson.dumps(line) for line in lines))
    rows = plan_rows(tmp_path, f"speakers.pool={pool}")
    assert voices_of(rows) == {"zh": {"a", "b"}, "en": {"c", "d"}}
    config = load_config(None, [ANY_VOICE, f"speakers.pool={pool}"])
    assert plan_settings(config)["speakers"]["by_language"] == {"en": ["c", "d"], "zh": ["a", "b"]}


def test_voices_of_one_language_cast_as_before(tmp_path):
    """The shipped v1 config's two English speakers: no language has voices of its own, the plan and
    its settings are those of a config without languages (outputs planned before stay fresh)."""
    named = plan_rows(tmp_path / "a", "speakers.voices=[英文女, 英文男]")
    plain = plan_rows(tmp_path / "b", "speakers.voices=[x, y]")
    rename = {"x": "英文女", "y": "英文男"}
    assert [row["speaker"] for row in named] == [rename[row["speaker"]] for row in plain]
    config = load_config(None, [ANY_VOICE, "speakers.voices=[英文女, 英文男]"])
    assert "by_language" not in plan_settings(config)["speakers"]
    assert casting_for(config).by_language == {}


def test_a_prompt_says_its_language(tmp_path):
    prompts = [
        f"tts.cosyvoice.prompts.{v}={{audio: {v}.wav, text: t, language: {lang}}}"
        for v, lang in [("anna", "en"), ("lin", "zh")]
    ]
    rows = plan_rows(tmp_path, "speakers.voices=[anna, lin, bo]", *prompts)
    voices = voices_of(rows)
    assert voices["zh"] == {"lin"}  # bo says no language: it takes turns of neither listed one
    assert voices["en"] == {"anna"}


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["speakers.by_language={zh: [lin]}"], "speakers.by_language.zh names voices not in speakers.voices: ['lin']"),
        (["speakers.by_language={zh: []}"], "speakers.by_language.zh names no voice"),
    ],
)
def test_by_language_is_checked_when_the_config_loads(overrides, said):
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["speakers.voices=[anna]", *overrides])
    assert said in str(refused.value)
