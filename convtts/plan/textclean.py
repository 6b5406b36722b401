"""Turn chat text (markdown, HTML, placeholders, emoji) into plain speakable text, then into short segments."""

from __future__ import annotations

import html
import math
import re

from convtts.config import SpokenPhrases
from convtts.plan import math_words, operators, spoken
from convtts.plan.vocabulary import is_chinese
from convtts.plan.vocabulary import words as vocabulary

# --- cleaning ---------------------------------------------------------------------------------

# Emoji and other pictographs: the emoji planes, misc symbols and dingbats (☀ ✔), arrows (→),
# geometric shapes used as bullets (■ ▶ ●), stars (⭐), variation selectors, ZWJ, keycaps, tags.
_PICTOGRAPH = re.compile(
    "[\U0001f000-\U0001faff\U0001fc00-\U0001fffd\u2600-\u27bf\u2b00-\u2bff\u2300-\u23ff"
    "\u25a0-\u25ff\u2190-\u21ff\ufe00-\ufe0f\u200d\u20e3\U000e0000-\U000e007f\u3030\u303d\u3297\u3299]+"
)
# C0/C1 controls except tab and newline, soft hyphen, zero-width and bidi marks, BOM, private use,
# lone surrogates.
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f"
    "\ufeff\ufff9-\ufffb\ue000-\uf8ff\U000f0000-\U0010ffff\ud800-\udfff]+"
)
_NEWLINES = re.compile("\r\n?|[\x85\u2028\u2029]")
# ```python ... ``` (or ~~~); an unclosed fence runs to the end, as markdown renders it.
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*\1[`~]*[ \t]*$|\Z)", re.M | re.S)
# <image>, <video>, <audio_1>, <ImageHere>, <|image|>, <|im_start|> ...
_PLACEHOLDER = re.compile(
    r"<\|[^<>|\n]{1,40}\|>|<\s*/?\s*(?:image|img|video|audio|speech|sound|media|file|picture|photo)"
    r"(?:[ _-]?\w{0,20})\s*/?\s*>",
    re.I,
)
_HTML_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_HTML_SCRIPT = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.I | re.S)
_TAG_ATTRS = r"""(?:[^<>"']|"[^"]*"|'[^']*')*"""
_HTML_BREAK = re.compile(rf"<(?:br|hr|/p|/div|/li|/h[1-6]|/tr|/blockquote)\b{_TAG_ATTRS}>", re.I)
_HTML_TAG = re.compile(
    r"</?(?:a|abbr|article|b|big|blockquote|body|br|button|center|cite|code|dd|del|details|div|dl|dt|em"
    r"|figcaption|figure|font|footer|form|h[1-6]|head|header|hr|html|i|iframe|img|input|ins|kbd|label|li"
    r"|main|mark|meta|nav|ol|p|pre|q|s|section|small|source|span|strike|strong|sub|summary|sup|table"
    rf"|tbody|td|tfoot|th|thead|title|tr|tt|u|ul|var)\b{_TAG_ATTRS}>",
    re.I,
)
# ![alt](src) keeps the alt text; [text](url "title") and [text][ref] keep the text.
_MD_IMAGE = re.compile(r"!\[([^\[\]\n]*)\]\((?:[^()\n]|\([^()\n]*\))*\)")
_MD_LINK = re.compile(r"\[([^\[\]\n]+)\](?:\((?:[^()\n]|\([^()\n]*\))*\)|\[[^\[\]\n]*\])")
_MD_LINK_DEF = re.compile(r"^[ \t]{0,3}\[[^\]\n]+\]:[ \t]*\S+.*$", re.M)
_MD_FOOTNOTE = re.compile(r"\[\^[^\]\n]*\]")
_EMPTY_BRACKETS = re.compile(r"\(\s*\)|\[\s*\]|<\s*>")
_MD_HEADER = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
_MD_RULE = re.compile(r"^[ \t]*([-*_=])(?:[ \t]*\1){2,}[ \t]*$", re.M)
_MD_QUOTE = re.compile(r"^[ \t]*(?:>[ \t]?)+", re.M)
_MD_BULLET = re.compile(r"^[ \t]*[-*+•◦▪‣][ \t]+", re.M)
_TABLE_RULE = re.compile(r"^[ \t]*\|?(?:[ \t]*:?-+:?[ \t]*\|)+[ \t]*(?::?-+:?[ \t]*)?$", re.M)
_TABLE_ROW = re.compile(r"^.*\|.*$", re.M)
# Inline markup keeps its words. Spans are bounded so that 100,000 stray asterisks stay linear.
_MD_BOLD = re.compile(r"(\*\*|__)(?=\S)([^\n]{0,500}?\S)\1")
_MD_ITALIC = re.compile(r"(?<![\w*])\*([^\s*](?:[^\n*]{0,500}[^\s*])?)\*(?![\w*])")
_MD_UNDERSCORE = re.compile(r"(?<![\w_])_([^\s_](?:[^\n_]{0,500}[^\s_])?)_(?![\w_])")
_MD_STRIKE = re.compile(r"~~([^\n~]{1,500}?)~~")
_MD_STRAY = re.compile(r"\*{2,}|_{2,}|~{2,}|(?<!\d)(?<!\d )\*(?! ?\d)")
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~])")
_ODD_SPACE = re.compile(r"[^\S\n ]")  # tab, no-break space, ideographic space ...
_SPACES = re.compile(r" {2,}")
# 'done .' -> 'done.', but 'is .NET' and 'is ::1' keep their space: the mark starts a word there.
_SPACE_BEFORE_PUNCT = re.compile(r" +(?=[.,;:!?]+(?:[\s\"')\]]|$))")
_SPEAKABLE = re.compile(r"[^\W_]")  # a letter or a digit, in any script


def clean(
    text: str, link_phrase: str | None = None, language: str = "en", phrases: SpokenPhrases | None = None
) -> tuple[str, str | None]:
    """Return (speakable text, None), or (whatever is left, reason) when no letter or digit remains.

    `language` is the turn's (ISO 639-1, convtts/language.py), for the words it is said in.

    Links are said as their domain ('nodejs dot org'), or as link_phrase when one is given; e-mail
    addresses, IP addresses and file paths as words (convtts/plan/spoken.py); math, operators and
    amounts of money as words of the turn's language (ISO 639-1: Chinese for 'zh', English for the
    rest; convtts/plan/math_words.py, operators.py); a code block or a drawing as a phrase
    (phrases). A turn that is nothing but links is skipped. Lines are kept apart by newlines: a
    list item or a heading stays its own sentence. Every rule is guarded by a cheap substring test:
    most chat text needs only a few of them.
    """
    said = phrases or _DEFAULT_PHRASES
    out = _plain_chars(text)
    if "<<" in out or "####" in out:
        out = operators.speak_calculator_notes(out, language)
    if "```" in out or "~~~" in out:
        out = _bridge_code(out, said.code or vocabulary(language)["code_phrase"], language)
    if "$" in out or "\\" in out or "[asy]" in out:
        out = math_words.speak_math(out, language, said.figure, said.dense_math, said.dense_math_words)
    if "<" in out:
        out = _PLACEHOLDER.sub(" ", out)
        out = _HTML_SCRIPT.sub("", _HTML_COMMENT.sub("", out))
    if "[" in out:
        out = _MD_LINK_DEF.sub("", _MD_FOOTNOTE.sub("", out))
        out = _MD_LINK.sub(r"\1", _MD_IMAGE.sub(r"\1", out))
    if "@" in out or "." in out:
        said = spoken.speak_links(spoken.speak_email(out) if "@" in out else out, link_phrase)
        if said != out and not _SPEAKABLE.search(spoken.strip_links(out)):
            return _tidy(spoken.strip_links(out)), "only a link or e-mail address"
        out = said
    if "<" in out:
        out = _HTML_TAG.sub("", _HTML_BREAK.sub("\n", out))
    if "&" in out:
        out = _plain_chars(html.unescape(out))  # '&nbsp;', '&#128512;'
    if "." in out or ":" in out:
        out = spoken.speak_addresses(out)
    if _OPERATOR_MARK.search(out) or ("." in out and language != "en" and is_chinese(language)):
        out = operators.speak_operators(out, language)  # before paths ('(n-2)/2') and emphasis ('2 * 3')
    if "/" in out or "\\" in out:
        out = spoken.speak_paths(out)
    if any(line.lstrip()[:1] in _LINE_MARKUP for line in out.split("\n")):
        out = _markdown_lines(out)
    if any(mark in out for mark in "`*_~\\"):
        out = _markdown_inline(out, vocabulary(language)["inline_code"])
    out = _tidy(out)
    if _SPEAKABLE.search(out):
        return out, None
    return out, _reason(text)


_OPERATOR_MARK = re.compile("[-+*/×÷=<>^%$≤≥≠≈·–−²³:]")
_DEFAULT_PHRASES = SpokenPhrases()


def _bridge_code(text: str, phrase: str, language: str) -> str:
    """A fenced code block leaves a phrase, joined to the line that led into it: 'Run this:' ->
    'Run this, as shown in the code.' A turn of nothing but code keeps no phrase (it is skipped)."""
    if not _SPEAKABLE.search(_PLACEHOLDER.sub("", _FENCE.sub("", text))):
        return _FENCE.sub("\n", text)
    return math_words.bridge_blocks(text, _FENCE, phrase, language)


def _plain_chars(text: str) -> str:
    """No control or zero-width characters, emoji or odd spaces; newlines as '\\n'."""
    if not text.replace("\n", "").isprintable():  # \r, tabs, controls, odd spaces, zero-width marks
        text = _ODD_SPACE.sub(" ", _CONTROL.sub("", _NEWLINES.sub("\n", text)))
    if not text.isascii():
        text = _PICTOGRAPH.sub("", text)
    return text


_LINE_MARKUP = frozenset("#>-*+_=|[•◦▪‣")  # a line starting with one of these may be markdown


def _markdown_lines(text: str) -> str:
    """Line-level markdown: '## Title', '> quote', '- item', '---', table rows."""
    if "#" in text:
        text = _MD_HEADER.sub(r"\1", text)
    text = _MD_RULE.sub("", text)
    if ">" in text:
        text = _MD_QUOTE.sub("", text)
    text = _MD_BULLET.sub("", text)
    if "[" in text:
        text = _MD_LINK_DEF.sub("", text)
    if "|" in text:
        text = _TABLE_RULE.sub("", text)
        # '| Cat | 4 legs |' -> 'Cat, 4 legs'
        text = _TABLE_ROW.sub(lambda m: ", ".join(c.strip() for c in m.group().split("|") if c.strip()), text)
    return text


def _markdown_inline(text: str, code_words: str = spoken.CODE_WORDS) -> str:
    """Inline markdown keeps its words: `code`, **bold**, *italic*, _italic_, ~~struck~~."""
    if "`" in text:
        text = spoken.speak_inline_code(text, code_words).replace("`", "")
    if "*" in text or "__" in text:
        text = _MD_BOLD.sub(r"\2", text)
        text = _MD_ITALIC.sub(r"\1", text)
    if "_" in text:
        text = _MD_UNDERSCORE.sub(r"\1", text)
    if "~~" in text:
        text = _MD_STRIKE.sub(r"\1", text)
    if "*" in text or "__" in text or "~~" in text:
        text = _MD_STRAY.sub("", text)
    if "\\" in text:
        text = _MD_ESCAPE.sub(r"\1", text)
    return text


def _tidy(text: str) -> str:
    """One space between words, no space before punctuation, no line without a letter or digit."""
    if "()" in text or "[]" in text or "<>" in text or "( " in text or "[ " in text or "< " in text:
        text = _EMPTY_BRACKETS.sub("", text)
    if "  " in text:
        text = _SPACES.sub(" ", text)
    if _SPACE_BEFORE_PUNCT.search(text):
        text = _SPACE_BEFORE_PUNCT.sub("", text)
    lines = [line for line in map(str.strip, text.split("\n")) if _SPEAKABLE.search(line)]
    if len(lines) > 1 and any(line[-1] in _CLOSERS for line in lines[:-1]):
        # '- Mix the flour (about 200 g)': a list item or heading ends in a full stop, like one ending in a word
        lines = [
            line + "." if i < len(lines) - 1 and line[-1] in _CLOSERS and line[-2:-1] not in _STOPS else line
            for i, line in enumerate(lines)
        ]
    return "\n".join(lines)


_CLOSERS = frozenset(")]\"'”’")
_STOPS = frozenset(".!?。！？")


# Each step removes one kind of unspeakable content; the first one that leaves no letter or
# digit names the reason.
_REASON_STEPS = (
    ("only a placeholder", lambda t: _PLACEHOLDER.sub(" ", t)),
    ("only code", lambda t: spoken.INLINE_CODE.sub("", _FENCE.sub("\n", t))),
    ("only markup", lambda t: _HTML_TAG.sub("", _HTML_BREAK.sub("", _HTML_COMMENT.sub("", t)))),
)


def _reason(original: str) -> str:
    if not original.strip():
        return "empty"
    text = _PICTOGRAPH.sub("", _CONTROL.sub("", _NEWLINES.sub("\n", original)))
    if not text.strip():
        return "no speakable characters"
    for reason, step in _REASON_STEPS:
        stripped = step(text)
        if stripped != text and not _SPEAKABLE.search(stripped):
            return reason
        text = stripped
    return "no speakable characters"


# --- splitting --------------------------------------------------------------------------------

# A full stop, ellipsis, ! or ? (with closing quotes or brackets) before a space or the end;
# a CJK full stop needs no space. Starting with a character class keeps the scan fast.
_SENTENCE_END = re.compile(r"[.!?…。！？](?:(?<=[。！？])|[.!?…]*[\"'’”)\]]*(?= |$))")
# A full stop after these never ends a sentence: 'Dr. Smith', 'e.g. a cat', 'Fig. 3'.
_NEVER_END = frozenset(
    "mr mrs ms dr prof sr jr st mt vs e.g i.e cf fig figs no nos approx ca gen col lt sgt capt rev hon "
    "dept vol viz al jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_INITIALS = re.compile(r"(?:[A-Za-z]\.)*[A-Za-z]")  # 'J' in 'J. Smith', 'U.S' in 'the U.S. Army'
_CLAUSE_BREAK = re.compile(r"(?<=[,;:—–]) +")


def split_segments(text: str, max_words: int) -> list[str]:
    """Split cleaned text into segments of at most max_words words, never inside a word.

    Sentences (and lines) are packed greedily; a sentence longer than max_words is cut at clause
    punctuation, and a clause still too long into equal runs of words.
    """
    units: list[tuple[str, int]] = []  # (text, words)
    lines = [" ".join(line.split()) if "  " in line or "\t" in line else line.strip() for line in text.split("\n")]
    lines = [line for line in lines if line]
    if sum(line.count(" ") + 1 for line in lines) <= max_words:  # a short turn: one segment, no sentence hunt
        return [" ".join(_stop_lines(lines))] if lines else []
    for line in _stop_lines(lines):
        for sentence in _sentences(line):
            words = sentence.count(" ") + 1
            if words <= max_words:
                units.append((sentence, words))
            else:
                units.extend(_split_long(sentence, max_words))
    return [piece for piece, _ in _pack(units, max_words)]


def _stop_lines(lines: list[str]) -> list[str]:
    """A heading or list item ends in a full stop, so that the voice pauses before the next line."""
    return [line + "." if i < len(lines) - 1 and line[-1].isalnum() else line for i, line in enumerate(lines)]


def _sentences(line: str) -> list[str]:
    out, start = [], 0
    for m in _SENTENCE_END.finditer(line):
        end = m.end()
        if _ends_sentence(line, m.start(), end):
            piece = line[start:end].strip()
            if piece:
                out.append(piece)
            start = end
    rest = line[start:].strip()
    if rest:
        out.append(rest)
    return out


def _ends_sentence(line: str, start: int, end: int) -> bool:
    mark = line[start]
    if mark not in ".…":
        return True  # ! ? and CJK marks always end a sentence
    if line[end + 1 : end + 2].islower():
        return False  # 'etc. and more', '... and then'
    if mark != "." or line[end - 1] == "…":
        return True
    word_start = line.rfind(" ", 0, start) + 1
    word = line[word_start:start]
    if word.lower() in _NEVER_END or (_INITIALS.fullmatch(word) and not (len(word) == 1 and word.islower())):
        return False  # 'J. Smith', 'the U.S. Army'; but 'each value of n.' ends there
    return not (word_start == 0 and word.isdigit())  # '1. The cat' is a list number


def _split_long(sentence: str, max_words: int) -> list[tuple[str, int]]:
    """Clauses packed up to max_words; a clause that is still too long is cut between words."""
    clauses = [(c, c.count(" ") + 1) for c in _CLAUSE_BREAK.split(sentence)]
    pieces: list[tuple[str, int]] = []
    for clause, count in _pack(clauses, max_words):
        if count <= max_words:
            pieces.append((clause, count))
            continue
        # Runs of nearly equal length: 31 words at 30 become 16 + 15, not 30 + 1.
        words = clause.split(" ")
        runs = math.ceil(count / max_words)
        size, longer = divmod(count, runs)
        start = 0
        for run in range(runs):
            end = start + size + (run < longer)
            pieces.append((" ".join(words[start:end]), end - start))
            start = end
    return pieces


def _pack(units: list[tuple[str, int]], max_words: int) -> list[tuple[str, int]]:
    """Join consecutive units while the total stays within max_words; a longer unit stands alone."""
    out: list[tuple[str, int]] = []
    current: list[str] = []
    count = 0
    for unit, words in units:
        if current and count + words > max_words:
            out.append((" ".join(current), count))
            current, count = [], 0
        current.append(unit)
        count += words
    if current:
        out.append((" ".join(current), count))
    return out
