"""Counts read as English: '1 shard', '2 shards', in the helper and in the lines the planner and export print."""

from __future__ import annotations

import logging

import pytest

from conftest import need
from convtts.counts import plural
from convtts.plan.command import describe
from convtts.results.export.command import _not_spoken


@pytest.mark.parametrize(
    "count, noun, plural_form, expected",
    [
        (1, "shard", None, "1 shard"),
        (0, "shard", None, "0 shards"),
        (2, "shard", None, "2 shards"),
        (1200, "utterance", None, "1,200 utterances"),
        (1, "entry", "entries", "1 entry"),
        (3, "entry", "entries", "3 entries"),
    ],
)
def test_plural(count, noun, plural_form, expected):
    assert plural(count, noun, plural_form) == expected


def _plan(count: int, shards: list[str]) -> dict:
    keys = ("conversations", "skipped_records", "turns", "skipped_turns", "segments", "words")
    return dict.fromkeys(keys, count) | {"estimated_hours": count / 60, "shards": shards}


def test_a_plan_of_one_reads_in_the_singular():
    assert describe(_plan(1, ["shard-00000"])) == (
        "Plan: 1 conversation (1 unusable record skipped), 1 turn to speak (1 skipped, see plan/skipped.jsonl), "
        "1 segment, 1 word, about 1 minute of audio, in 1 shard (shard-00000)."
    )


def test_a_plan_of_many_reads_in_the_plural():
    assert describe(_plan(2, ["shard-00000", "shard-00001"])) == (
        "Plan: 2 conversations (2 unusable records skipped), 2 turns to speak (2 skipped, see plan/skipped.jsonl), "
        "2 segments, 2 words, about 2 minutes of audio, in 2 shards (shard-00000 .. shard-00001)."
    )


def test_the_export_note_agrees_with_its_count():
    assert _not_spoken(1) == "1 segment of the output is failed or pending"
    assert _not_spoken(2) == "2 segments of the output are failed or pending"


def test_the_gate_says_one_take_at_a_time(caplog):
    need("pocketsphinx", "validate")
    from convtts.config import ValidateConfig
    from convtts.gate.quality import open_gate

    with caplog.at_level(logging.INFO, logger="convtts.gate.quality"):
        open_gate(ValidateConfig(enabled=True))
    assert "quality gate on (recogniser pocketsphinx, 1 take at a time)" in caplog.text
