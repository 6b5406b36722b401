"""Cleaning rules as a table of input -> speakable text, and the segment splitter's guarantees."""

from __future__ import annotations

import re
import time

import pytest

from convtts.config import ConfigError, load_config
from convtts.plan.conversation import plan_conversation
from convtts.plan.freshness import fingerprint
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
    ("snake_case stays, 2 * 3 = 6.", "snake_case stays, 2 times 3 equals 6."),
    ("Before\n```python\nprint('x')\n```\nAfter.", "Before\nAs shown in the code.\nAfter."),
    ("Unclosed\n~~~\ncode to the end", "Unclosed\nAs shown in the code."),
    # links, addresses: said as words (more in SPOKEN_CASES)
    ("Visit https://www.example.com/a?b=1 today.", "Visit example dot com today."),
    ("Go to www.example.org, then stop.", "Go to example dot org, then stop."),
    (
        "Mail jane.doe+x@example.co.uk or mailto:a@b.io please.",
        "Mail jane dot doe plus x at example dot co dot uk or a at b dot io please.",
    ),
    ("Wiki (https://en.wikipedia.org/wiki/Cat_(animal)) says so.", "Wiki (wikipedia dot org) says so."),
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
    (
        "It costs $3.50 (about 3.5 euros), 50% off.",
        "It costs 3 dollars and 50 cents (about 3.5 euros), 50 percent off.",
    ),
]


@pytest.mark.parametrize("raw, expected", CLEAN_CASES)
def test_clean(raw, expected):
    assert clean(raw) == (expected, None)


# What a voice cannot read is said as words, so that the sentence around it still reads.
SPOKEN_CASES = [
    # links: the registrable domain, without www. or the path
    (
        "See https://nodejs.org/en/download and https://www.npmjs.com/package/express for Node.js.",
        "See nodejs dot org and npmjs dot com for Node.js.",
    ),
    ("Docs live at https://docs.python.org/3/library/re.html, mostly.", "Docs live at python dot org, mostly."),
    ("The BBC (https://www.bbc.co.uk/news) reported it.", "The BBC (bbc dot co dot uk) reported it."),
    ("Clone http://github.com/torvalds/linux.git tonight.", "Clone github dot com tonight."),
    ("Read pkg.go.dev/fmt before you start.", "Read go dot dev before you start."),
    ("Try nodejs.org or deno.com instead.", "Try nodejs dot org or deno dot com instead."),
    ("Open <https://example.net/login> in a browser.", "Open example dot net in a browser."),
    ("Files sit on ftp://files.example.org/pub today.", "Files sit on example dot org today."),
    ("The API answers at http://localhost:8080/api quickly.", "The API answers at localhost quickly."),
    ("Point it at http://192.168.0.10:9000/ first.", "Point it at 192 dot 168 dot 0 dot 10 first."),
    # markdown links keep their text; a link that is its own text is said as a domain
    ("Read [the manual](https://example.com/manual) slowly.", "Read the manual slowly."),
    ("Go to [https://rust-lang.org](https://rust-lang.org) now.", "Go to rust-lang dot org now."),
    ("**Star it** at **https://github.com/a/b** today.", "Star it at github dot com today."),
    # e-mail addresses
    ("Write to support@example.com for help.", "Write to support at example dot com for help."),
    ("Ask first_last@mail.example.org, not me.", "Ask first underscore last at mail dot example dot org, not me."),
    # file paths: the file's name
    ("Edit /etc/nginx/nginx.conf and restart it.", "Edit nginx dot conf and restart it."),
    ("Open ~/.bashrc in an editor.", "Open dot bashrc in an editor."),
    ("Run ./scripts/build_all.sh before tests.", "Run build all dot sh before tests."),
    ("Logs are in /var/log/ and nowhere else.", "Logs are in log and nowhere else."),
    ("Save it as C:\\Users\\ana\\notes.txt then close.", "Save it as notes dot txt then close."),
    ("Copy src/main.py to the server.", "Copy main dot py to the server."),
    ("Use it and/or sell it 24/7 at 25 km/h.", "Use it and/or sell it 24/7 at 25 km/h."),
    # inline code and code blocks
    ("Type `git status` to check.", "Type git status to check."),
    ("Call `flush()` twice.", "Call flush twice."),
    ("Set `retries = 3` first.", "Set retries equals 3 first."),
    ("Run `ls -la | grep log` to list them.", "Run this code to list them."),
    ("Edit `/etc/hosts` as root.", "Edit hosts as root."),
    ("Use this:\n```bash\nrm -rf build\n```\nThen rebuild.", "Use this, as shown in the code.\nThen rebuild."),
    # IP addresses, digit group by group
    ("The loopback address is ::1 on most systems.", "The loopback address is double colon 1 on most systems."),
    ("Ping 127.0.0.1.", "Ping 127 dot 0 dot 0 dot 1."),
    (
        "Allow 10.0.0.0/8 and port 192.168.1.1:22 only.",
        "Allow 10 dot 0 dot 0 dot 0 slash 8 and port 192 dot 168 dot 1 dot 1 port 22 only.",
    ),
    ("Route 2001:db8::1 and fe80::1 next.", "Route 2001 colon db8 double colon 1 and fe80 double colon 1 next."),
    ("Use std::vector at 10:30, version 1.2.3.", "Use std::vector at 10:30, version 1.2.3."),
    ("Is .NET free?", "Is .NET free?"),
    # emoji
    ("Ship it 🚀 and relax 😎.", "Ship it and relax."),
    ("🔥 Hot take: tabs win 👍🏽", "Hot take: tabs win"),
    ("Rust 🦀 and Go 🐹 , both fast .", "Rust and Go, both fast."),
    # markdown
    ("## Setup\n- Install **Docker**\n- Run `make`", "Setup\nInstall Docker\nRun make"),
    ("| Tool | Link |\n|---|---|\n| npm | https://npmjs.com |", "Tool, Link\nnpm, npmjs dot com"),
    ("> Note: see [docs](http://x.io/d) and __retry__ later.", "Note: see docs and retry later."),
]


@pytest.mark.parametrize("raw, expected", SPOKEN_CASES)
def test_unspeakable_is_said_as_words(raw, expected):
    assert clean(raw) == (expected, None)


def test_a_link_phrase_takes_the_place_of_every_link():
    raw = "See https://nodejs.org and www.npmjs.com/package/x for Node.js, or mail a@b.io."
    assert clean(raw, link_phrase="a link") == ("See a link and a link for Node.js, or mail a at b dot io.", None)


# Words of letters only, outside what cleaning drops on purpose (code, comments, scripts).
_DROPPED_ON_PURPOSE = re.compile(r"```.*?```|`[^`\n]*`|~~~.*|<!--.*?-->|<script>.*?</script>", re.S)
_PLAIN_WORD = re.compile(r"[A-Za-z]+[.,!?:;]?")


def _plain_words(raw: str) -> list[str]:
    return [w.rstrip(".,!?:;") for w in _DROPPED_ON_PURPOSE.sub(" ", raw).split() if _PLAIN_WORD.fullmatch(w)]


@pytest.mark.parametrize("raw", [raw for raw, _ in CLEAN_CASES + SPOKEN_CASES])
def test_cleaned_text_reads_naturally(raw):
    text, _ = clean(raw)
    for line in text.split("\n"):
        assert "  " not in line and line == line.strip()
        assert not re.search(r" [,.;!?](?:\s|$)", line), line
    spoken = set(re.findall(r"[A-Za-z]+", text))
    assert [w for w in _plain_words(raw) if w not in spoken] == []


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


def test_the_plan_says_links_as_text_links_asks():
    record = {"conversations": [{"from": "human", "value": "Is https://www.nodejs.org/en/about up?"}]}
    domain, _ = plan_conversation("c", record, load_config(None))
    phrase, _ = plan_conversation("c", record, load_config(None, ["text.links=phrase", "text.link_phrase=the site"]))
    assert [s["text"] for s in domain] == ["Is nodejs dot org up?"]
    assert [s["text"] for s in phrase] == ["Is the site up?"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("text.links=drop", "text.links must be one of"),
        ("text.link_phrase=", "text.link_phrase must be"),
        ("text.link_phrase=<a link>", "text.link_phrase must be"),
        ("text.link_phrase=link 2", "text.link_phrase must be"),
        ("text.link_phrase=one two three four five six", "text.link_phrase must be"),
    ],
)
def test_link_settings_are_checked_up_front(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_an_output_planned_before_the_link_settings_stays_fresh():
    """The default link settings leave the plan's fingerprint as it was before they existed (the
    figures below are from that version), so an output in progress is not called stale by an upgrade;
    saying links as a phrase is a different plan."""
    info = {"path": "/data/in.json", "size": 1, "mtime_ns": 0}  # a version-2 plan knew its input by these
    default = load_config(None)
    assert (
        fingerprint("", default, info, version=2) == "773a7f06894438b683e6673017b2c97c13f64ff1b90378acacbfab22a43f9ef4"
    )
    shorter = load_config(None, ["text.max_words=20"])
    assert (
        fingerprint("", shorter, info, version=2) == "dbadbedb7d7ac755ddd13fd1ca44f8212c813a6f06235c89803de0bd258df365"
    )
    phrase = load_config(None, ["text.links=phrase"])
    assert fingerprint("", phrase, info, version=2) != fingerprint("", default, info, version=2)
