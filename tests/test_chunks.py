"""A chunk over the text tokens a decode row was sized for is cut into pieces within them (chunks.py)."""

from __future__ import annotations

import json

from conftest import REPO
from convtts.speak.cosyvoice.chunks import cut, within_budget


def syllables(text: str) -> int:
    """A stand-in token count: one token a word, and one more for every 3 letters past the first 3."""
    return sum(1 + max(0, len(word) - 3) // 3 for word in text.split())


def ocr_row() -> str:
    """The short-turn file's densest OCR-token list (a real row the planner keeps at 30 words)."""
    records = json.loads((REPO / "bench" / "data" / "llava15_short_turns.json").read_text())
    for record in records:
        for turn in record["conversations"]:
            if "CALORIECOLA, ZERO" in turn["value"]:
                return turn["value"]
    raise AssertionError("the OCR row is gone from bench/data/llava15_short_turns.json")


def test_a_chunk_within_the_budget_is_left_alone():
    text = "The weather was lovely this morning."
    assert cut(text, syllables, 40) == [text]
    assert within_budget([text, "Yes."], syllables, 0) == [text, "Yes."]


def test_a_chunk_over_the_budget_is_cut_between_words_into_close_pieces():
    text = ocr_row()
    budget = 20
    pieces = cut(text, syllables, budget)
    assert " ".join(pieces).split() == text.split()  # every word once, in order
    sizes = [syllables(piece) for piece in pieces]
    assert max(sizes) <= budget, sizes
    assert len(pieces) <= -(-syllables(text) // budget) + 1, sizes
    assert min(sizes) >= budget // 3, sizes  # no stub of a word or two: a short row costs as much as a long one


def test_a_piece_ends_after_a_comma_where_one_is_near():
    words = [f"word{i}," if i in (7, 16) else f"word{i}" for i in range(24)]
    pieces = cut(" ".join(words), lambda text: len(text.split()), 10)
    assert [len(piece.split()) for piece in pieces] == [8, 9, 7], pieces  # not 8, 8, 8 with a cut between words


def test_a_word_longer_than_the_budget_stays_whole():
    long_word = "x" * 90
    pieces = cut(f"one two {long_word} three", syllables, 10)
    assert long_word in pieces and " ".join(pieces).split() == ["one", "two", long_word, "three"]
