"""Cleaning rules as a table of input -> speakable text, and the segment splitter's guarantees."""

from __future__ import annotations

import time

import pytest

from convtts.plan.textclean import clean, split_segments

CLEAN_CASES = [
    # placeholders
    ("<image>\nWhat is on the table?", "What is on the table?"),
    ("Look at <video> and <audio> here.", "Look at and here."),
    ("<Image_1> <ImageHere> <|image|> The dog.", "The dog."),
    ("<|im_start|>user Hi<|im_end|>", "user Hi"),
    # HTML
    ('A <b>bold</b> <span class="x">move</span>.', "A bold move."),
    ("One<br>Two<br/>Three", "One\nTwo\nThree"),
    ("<p>First.</p><p>Second.</p>", "First.\nSecond."),
    ("Salt &amp; pepper&nbsp;only.", "Salt & pepper only."),
    ("Hidden <!-- a comment --> text.", "Hidden text."),
    ("Code <script>alert(1)</script> gone.", "Code gone."),
    ("If x < y and y > z then x < z.", "If x < y and y > z then x < z."),
    # markdown
    ("# Title\nText.", "Title\nText."),
    ("### Deep heading ###", "Deep heading"),
    ("**Bold** and __strong__ words.", "Bold and strong words."),
    ("*Italic* and _emphasis_ here.", "Italic and emphasis here."),
    ("***Both*** at once.", "Both at once."),
    ("Use `pip install` now.", "Use pip install now."),
    ("See [the guide](https://example.com/guide) first.", "See the guide first."),
    ("![a red car](car.png) parked.", "a red car parked."),
    ("- apples\n- pears\n* plums\n+ figs", "apples\npears\nplums\nfigs"),
    ("1. The cat\n2. The dog", "1. The cat\n2. The dog"),
    ("| Animal | Legs |\n|---|:---:|\n| Cat | 4 |", "Animal, Legs\nCat, 4"),
    ("> A quoted line.\n> > Nested.", "A quoted line.\nNested."),
    ("Above.\n\n---\n\nBelow.", "Above.\nBelow."),
    ("~~old~~ new", "old new"),
    ("snake_case stays, 2 * 3 = 6.", "snake_case stays, 2 * 3 = 6."),
    ("Before\n```python\nprint('x')\n```\nAfter.", "Before\nAfter."),
    ("Unclosed\n~~~\ncode to the end", "Unclosed"),
    # links, addresses
    ("Visit https://www.example.com/a?b=1 today.", "Visit today."),
    ("Go to www.example.org, then stop.", "Go to, then stop."),
    ("Mail jane.doe+x@example.co.uk or mailto:a@b.io please.", "Mail or please."),
    ("Wiki (https://en.wikipedia.org/wiki/Cat_(animal)) says so.", "Wiki says so."),
    # emoji, pictographs, control characters
    ("Great job 🎉👍🏽!", "Great job!"),
    ("Family 👨‍👩‍👧 photo ✔ → done ⭐", "Family photo done"),
    ("Tab\there, bell\x07, nul\x00, zero\u200bwidth.", "Tab here, bell, nul, zerowidth."),
    ("Line one\r\nLine two\rLine three", "Line one\nLine two\nLine three"),
    ("Bidi \u202emark\u202c and BOM\ufeff.", "Bidi mark and BOM."),
    # whitespace and punctuation
    ("  lots   of\t\tspace  \n\n\n  here  ", "lots of space\nhere"),
    ("Non\u00a0breaking\u3000spaces.", "Non breaking spaces."),
    ('Keep: commas, colons; quotes "yes" and (parens)!', 'Keep: commas, colons; quotes "yes" and (parens)!'),
    ("Café, naïve, Straße, 東京, Москва.", "Café, naïve, Straße, 東京, Москва."),
    ("It costs $3.50 (about 3.5 euros), 50% off.", "It costs $3.50 (about 3.5 euros), 50% off."),
]


@pytest.mark.parametrize("raw, expected", CLEAN_CASES)
def test_clean(raw, expected):
    assert clean(raw) == (expected, None)


NOTHING_SPEAKABLE = [
    ("", "empty"),
    ("   \n\t ", "empty"),
    ("<image>", "only a placeholder"),
    ("<image>\n<video>", "only a placeholder"),
    ("```\nx = 1\n```", "only code"),
    ("<image>\n```js\nf()\n```", "only code"),
    ("https://example.com/x", "only a link or e-mail address"),
    ("someone@example.com", "only a link or e-mail address"),
    ("<br><hr>", "only markup"),
    ("🎉🎉🎉", "no speakable characters"),
    ("... --- !!!", "no speakable characters"),
    ("\x00\x01\x02", "no speakable characters"),
]


@pytest.mark.parametrize("raw, reason", NOTHING_SPEAKABLE)
def test_nothing_speakable_has_a_reason(raw, reason):
    text, why = clean(raw)
    assert why == reason
    assert not any(ch.isalnum() for ch in text)


SPLIT_CASES = [
    # (text, max_words, expected segments)
    ("One two. Three four. Five six.", 4, ["One two. Three four.", "Five six."]),
    # an abbreviation does not end a sentence: with 3 words a segment, 'I met Dr.' would be one
    ("I met Dr. Lee. We ate.", 3, ["I met", "Dr. Lee.", "We ate."]),
    ("Eat fruit e.g. apples. Yes sir.", 3, ["Eat fruit", "e.g. apples.", "Yes sir."]),
    ("We love the U.S. Army. Yes sir.", 3, ["We love the", "U.S. Army.", "Yes sir."]),
    ("Ask Mr. and Mrs. Smith. Now.", 6, ["Ask Mr. and Mrs. Smith. Now."]),
    ("It is 3.5 m long. Really.", 5, ["It is 3.5 m long.", "Really."]),
    ("Wait! Why? Because.", 2, ["Wait! Why?", "Because."]),
    ("Steps:\n1. Mix the flour\n2. Bake it", 5, ["Steps: 1. Mix the flour.", "2. Bake it"]),
    ("Steps:\n1. Mix the flour\n2. Bake it", 4, ["Steps:", "1. Mix the flour.", "2. Bake it"]),
    ("Heading\nBody text here.", 30, ["Heading. Body text here."]),
    ("a b c, d e f; g h i: j k", 4, ["a b c,", "d e f;", "g h i:", "j k"]),
    ("one two three four five six seven", 3, ["one two three", "four five", "six seven"]),
    ("etc. and so on. Next one.", 30, ["etc. and so on. Next one."]),
    ("Short. " + "Word " * 10 + "end.", 6, ["Short.", " ".join(["Word"] * 6), "Word Word Word Word end."]),
    ("Lowercase after a stop. then it goes on.", 30, ["Lowercase after a stop. then it goes on."]),
    ("", 5, []),
]


@pytest.mark.parametrize("text, max_words, expected", SPLIT_CASES)
def test_split_segments(text, max_words, expected):
    assert split_segments(text, max_words) == expected


def _words_in_order(text: str) -> list[str]:
    return [w for line in text.split("\n") for w in line.split()]


@pytest.mark.parametrize("max_words", [3, 7, 30])
def test_split_respects_max_words_and_keeps_every_word(max_words):
    text, _ = clean(
        "The image shows a busy street, with cars, buses and bicycles; people walk along the sidewalk "
        "while a street vendor sells hot dogs — a typical scene in New York City, e.g. near Times Square. "
        "Supercalifragilisticexpialidocious-is-one-very-long-token here.\n- A list item without a stop\n"
        "2. Another item that goes on and on and on and on and on and on and on and on and on and on."
    )
    segments = split_segments(text, max_words)
    assert all(1 <= len(s.split()) <= max_words for s in segments)
    spoken = " ".join(segments).split()
    original = _words_in_order(text)
    assert len(spoken) == len(original)
    # never mid-word: every spoken token is an original word, at most with a full stop added
    assert all(s == o or s == o + "." for s, o in zip(spoken, original))


def test_long_turn_is_fast():
    sentence = "The **quick** brown fox, seen in <b>Dr. Lee's</b> garden, jumps over the lazy dog 🐕. "
    text = (sentence * 1200)[:100_000]
    start = time.perf_counter()
    cleaned, reason = clean(text)
    segments = split_segments(cleaned, 30)
    assert time.perf_counter() - start < 1.0
    assert reason is None and len(segments) > 500
    assert all(len(s.split()) <= 30 for s in segments)


@pytest.mark.parametrize(
    "text",
    [
        "*a " * 33_000,  # asterisks that never close: the emphasis rule must stay linear
        "x" * 100_000,  # one huge word
        "[" * 50_000 + "]" * 50_000,
        "<b" * 50_000,
        "_" * 100_000,
    ],
)
def test_pathological_turns_are_fast(text):
    start = time.perf_counter()
    cleaned, _ = clean(text)
    segments = split_segments(cleaned, 30)
    assert time.perf_counter() - start < 2.0
    assert all(len(s.split()) <= 30 for s in segments)
