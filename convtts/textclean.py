"""Turn chat text (markdown, HTML, placeholders, emoji) into plain speakable text, then into short segments."""
from __future__ import annotations

import html
import math
import re

# --- cleaning ---------------------------------------------------------------------------------

# Emoji and other pictographs: the emoji planes, misc symbols and dingbats (☀ ✔), arrows (→),
# geometric shapes used as bullets (■ ▶ ●), stars (⭐), variation selectors, ZWJ, keycaps, tags.
_PICTOGRAPH = re.compile(
    "[\U0001F000-\U0001FAFF\U0001FC00-\U0001FFFD\u2600-\u27BF\u2B00-\u2BFF\u2300-\u23FF"
    "\u25A0-\u25FF\u2190-\u21FF\uFE00-\uFE0F\u200D\u20E3\U000E0000-\U000E007F\u3030\u303D\u3297\u3299]+"
)
# C0/C1 controls except tab and newline, soft hyphen, zero-width and bidi marks, BOM, private use,
# lone surrogates.
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f"
    "\ufeff\ufff9-\ufffb\ue000-\uf8ff\U000F0000-\U0010FFFF\ud800-\udfff]+"
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
_URL = re.compile(
    r"(?:\b(?:https?|ftp)://|\bwww\.)(?:[^\s<>\"'()\[\]]|\([^\s()]*\))*(?:[^\s<>\"'()\[\].,;:!?]|\([^\s()]*\))"
)
_EMAIL = re.compile(r"(?:mailto:)?\b[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+\b")
_EMPTY_BRACKETS = re.compile(r"\(\s*\)|\[\s*\]|<\s*>")
_MD_HEADER = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
_MD_RULE = re.compile(r"^[ \t]*([-*_=])(?:[ \t]*\1){2,}[ \t]*$", re.M)
_MD_QUOTE = re.compile(r"^[ \t]*(?:>[ \t]?)+", re.M)
_MD_BULLET = re.compile(r"^[ \t]*[-*+•◦▪‣][ \t]+", re.M)
_TABLE_RULE = re.compile(r"^[ \t]*\|?(?:[ \t]*:?-+:?[ \t]*\|)+[ \t]*(?::?-+:?[ \t]*)?$", re.M)
_TABLE_ROW = re.compile(r"^.*\|.*$", re.M)
# Inline markup keeps its words. Spans are bounded so that 100,000 stray asterisks stay linear.
_MD_CODE = re.compile(r"(`+)([^`\n]+?)\1")
_MD_BOLD = re.compile(r"(\*\*|__)(?=\S)([^\n]{0,500}?\S)\1")
_MD_ITALIC = re.compile(r"(?<![\w*])\*([^\s*](?:[^\n*]{0,500}[^\s*])?)\*(?![\w*])")
_MD_UNDERSCORE = re.compile(r"(?<![\w_])_([^\s_](?:[^\n_]{0,500}[^\s_])?)_(?![\w_])")
_MD_STRIKE = re.compile(r"~~([^\n~]{1,500}?)~~")
_MD_STRAY = re.compile(r"`+|\*{2,}|_{2,}|~{2,}|(?<!\d)(?<!\d )\*(?! ?\d)")
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~])")
_SPACES = re.compile(r"[^\S\n]+")
_SPACE_BEFORE_PUNCT = re.compile(r" +(?=[.,;:!?])")
_SPEAKABLE = re.compile(r"[^\W_]")  # a letter or a digit, in any script


def clean(text: str) -> tuple[str, str | None]:
    """Return (speakable text, None), or (whatever is left, reason) when no letter or digit remains.

    Lines are kept apart by newlines: a list item or a heading stays its own sentence.
    """
    out = _NEWLINES.sub("\n", text)
    out = _PICTOGRAPH.sub("", _CONTROL.sub("", out))
    out = _FENCE.sub("\n", out)
    out = _PLACEHOLDER.sub(" ", out)
    if "<" in out:
        out = _HTML_SCRIPT.sub("", _HTML_COMMENT.sub("", out))
    if "[" in out:
        out = _MD_LINK_DEF.sub("", _MD_FOOTNOTE.sub("", out))
        out = _MD_LINK.sub(r"\1", _MD_IMAGE.sub(r"\1", out))
    if "@" in out:
        out = _EMAIL.sub("", out)
    if "://" in out or "www." in out:
        out = _URL.sub("", out)
    if "<" in out:
        out = _HTML_TAG.sub("", _HTML_BREAK.sub("\n", out))
    if "&" in out:
        out = html.unescape(out)
    out = _markdown_lines(out)
    out = _markdown_inline(out)
    out = _tidy(out)
    if _SPEAKABLE.search(out):
        return out, None
    return out, _reason(text)


def _markdown_lines(text: str) -> str:
    """Line-level markdown: '## Title', '> quote', '- item', '---', table rows."""
    if "#" in text:
        text = _MD_HEADER.sub(r"\1", text)
    text = _MD_RULE.sub("", text)
    if ">" in text:
        text = _MD_QUOTE.sub("", text)
    text = _MD_BULLET.sub("", text)
    if "|" in text:
        text = _TABLE_RULE.sub("", text)
        # '| Cat | 4 legs |' -> 'Cat, 4 legs'
        text = _TABLE_ROW.sub(lambda m: ", ".join(c.strip() for c in m.group().split("|") if c.strip()), text)
    return text


def _markdown_inline(text: str) -> str:
    """Inline markdown keeps its words: `code`, **bold**, *italic*, _italic_, ~~struck~~."""
    if "`" in text:
        text = _MD_CODE.sub(r"\2", text)
    if "*" in text or "__" in text:
        text = _MD_BOLD.sub(r"\2", text)
        text = _MD_ITALIC.sub(r"\1", text)
    if "_" in text:
        text = _MD_UNDERSCORE.sub(r"\1", text)
    if "~~" in text:
        text = _MD_STRIKE.sub(r"\1", text)
    text = _MD_STRAY.sub("", text)
    if "\\" in text:
        text = _MD_ESCAPE.sub(r"\1", text)
    return text


def _tidy(text: str) -> str:
    """One space between words, no space before punctuation, no line without a letter or digit."""
    text = _SPACES.sub(" ", _EMPTY_BRACKETS.sub("", text))
    lines = (_SPACE_BEFORE_PUNCT.sub("", line.strip()) for line in text.split("\n"))
    return "\n".join(line for line in lines if _SPEAKABLE.search(line))


# Each step removes one kind of unspeakable content; the first one that leaves no letter or
# digit names the reason.
_REASON_STEPS = (
    ("only a placeholder", lambda t: _PLACEHOLDER.sub(" ", t)),
    ("only code", lambda t: _MD_CODE.sub("", _FENCE.sub("\n", t))),
    ("only a link or e-mail address", lambda t: _URL.sub("", _EMAIL.sub("", t))),
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
# CJK full stops need no space.
_SENTENCE_END = re.compile(r"[.!?…]+[\"'’”)\]]*(?= |$)|[。！？]+")
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
    units: list[str] = []
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    for i, line in enumerate(lines):
        if i < len(lines) - 1 and line[-1].isalnum():
            line += "."  # a heading or list item: a full stop makes the voice pause before the next line
        for sentence in _sentences(line):
            if len(sentence.split()) <= max_words:
                units.append(sentence)
            else:
                units.extend(_split_long(sentence, max_words))
    return _pack(units, max_words)


def _sentences(line: str) -> list[str]:
    out, start = [], 0
    for m in _SENTENCE_END.finditer(line):
        if _ends_sentence(line, m):
            piece = line[start : m.end()].strip()
            if piece:
                out.append(piece)
            start = m.end()
    rest = line[start:].strip()
    if rest:
        out.append(rest)
    return out


def _ends_sentence(line: str, m: re.Match) -> bool:
    mark = m.group()
    if "." not in mark and "…" not in mark:
        return True  # ! ? and CJK marks always end a sentence
    after = line[m.end() + 1 : m.end() + 2]
    if after.islower():
        return False  # 'etc. and more', '... and then'
    if mark[0] != ".":
        return True
    word_start = line.rfind(" ", 0, m.start()) + 1
    word = line[word_start : m.start()]
    if word.lower() in _NEVER_END or _INITIALS.fullmatch(word):
        return False
    return not (word_start == 0 and word.isdigit())  # '1. The cat' is a list number


def _split_long(sentence: str, max_words: int) -> list[str]:
    """Clauses packed up to max_words; a clause that is still too long is cut between words."""
    pieces: list[str] = []
    for clause in _pack(_CLAUSE_BREAK.split(sentence), max_words):
        words = clause.split()
        if len(words) <= max_words:
            pieces.append(clause)
            continue
        # Runs of nearly equal length: 31 words at 30 become 16 + 15, not 30 + 1.
        runs = math.ceil(len(words) / max_words)
        size, longer = divmod(len(words), runs)
        start = 0
        for run in range(runs):
            end = start + size + (run < longer)
            pieces.append(" ".join(words[start:end]))
            start = end
    return pieces


def _pack(units: list[str], max_words: int) -> list[str]:
    """Join consecutive units while the total stays within max_words; a longer unit stands alone."""
    out: list[str] = []
    current: list[str] = []
    count = 0
    for unit in units:
        n = len(unit.split())
        if current and count + n > max_words:
            out.append(" ".join(current))
            current, count = [], 0
        current.append(unit)
        count += n
    if current:
        out.append(" ".join(current))
    return out
