"""LaTeX math said as words: '$\\frac{x}{4} = 1$' -> 'x over 4 equals 1' (zh: '四分之x等于1').

Inline math ($...$, \\(...\\)), display math ($$...$$, \\[...\\]) and bare environments
(\\begin{align*} ... \\end{align*}) are found in a turn and each is read by a small recursive reader
(math_reader.py): fractions, powers, roots, subscripts, Greek letters, degrees, \\boxed (its content),
\\text (its text), operators and relations as words; \\left, \\right and spacing are silent. An
environment is said row by row, its rows as sentences, a matrix of one column as a vector. A span whose
spoken form runs past a number of words is said as a phrase instead ('a long expression'), with its
boxed answer after it.

Which dollar sign opens math: the rule pandoc and most markdown math renderers use. An opening $
has a non-space character to its right, a closing one a non-space character to its left and no
digit after it, so that '$20 and $30' stays two amounts and '$4$ tickets' is math.

Drawing code between [asy] and [/asy] is never said: a phrase takes its place ('as shown in the
figure').
"""

from __future__ import annotations

import re

from convtts.plan.math_reader import Reader
from convtts.plan.vocabulary import is_chinese, join, words

# Where math opens: $$, \[, \(, \begin{env}, or a $ (inline, by the pandoc rule below).
_OPENER = re.compile(r"\$\$|\\\[|\\\(|\\begin\{([A-Za-z]+\*?)\}|(?<![\\$])\$(?![\s$])")
_CLOSERS = {"$$": "$$", "\\[": "\\]", "\\(": "\\)"}
_INLINE = re.compile(r"\$((?:[^$\\\n`]|\\.|\n(?![ \t]*\n)){1,2000}?)(?<![\s\\])\$(?!\d)")
_ASY = re.compile(r"\[asy\].*?(?:\[/asy\]|\Z)", re.S | re.I)
_ENV = re.compile(r"\\begin\{([A-Za-z]+)\*?\}(?:\{[^{}]*\})?(.*?)\\end\{\1\*?\}", re.S)
_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?|\.\d+|[A-Za-z]+|\x01\d+\x02|\s+|.", re.S)
_THIN_SPACES = re.compile(r"\\[!,;: ]|~")
_MATRICES = frozenset("matrix pmatrix bmatrix Bmatrix vmatrix Vmatrix smallmatrix".split())


def speak_math(
    text: str, language: str = "en", figure_phrase: str = "", dense_phrase: str = "", dense_words: int = 60
) -> str:
    """Every math span in text said as words, drawing code as figure_phrase (or the language's own)."""
    vocab = words(language)
    if "[asy]" in text or "[ASY]" in text:
        text = bridge_blocks(text, _ASY, figure_phrase or vocab["figure_phrase"], language)
    if "$" not in text and "\\" not in text:
        return text
    dense_phrase = dense_phrase or vocab["dense_math_phrase"]
    pieces, last = [], 0
    for start, end, source in _spans(text):
        pieces += [text[last:start], _say_span(text, start, end, source, language, dense_phrase, dense_words)]
        last = end
    return "".join(pieces) + text[last:]


def _spans(text: str):
    """(start, end, LaTeX source) of each math span, left to right, in one pass: a delimiter whose
    closing one is nowhere after it is never looked for again, so that unclosed '\\[' stays linear."""
    unclosed: set[str] = set()
    position = 0
    while match := _OPENER.search(text, position):
        opener = match.group()
        if opener == "$":
            inline = _INLINE.match(text, match.start())
            if inline:
                yield match.start(), inline.end(), inline.group(1)
                position = inline.end()
            else:
                position = match.end()
            continue
        closer = _CLOSERS.get(opener) or f"\\end{{{match.group(1)}}}"
        end = -1 if closer in unclosed else text.find(closer, match.end())
        if end < 0:
            unclosed.add(closer)
            position = match.end()
            continue
        inner = text[match.end() : end] if opener in _CLOSERS else text[match.start() : end + len(closer)]
        yield match.start(), end + len(closer), inner
        position = end + len(closer)


def bridge_blocks(text: str, block: re.Pattern, phrase: str, language: str) -> str:
    """Each block (code, a drawing) said as phrase, joined to what led into it: 'Run this:' ->
    'Run this, as shown in the code.'; after a finished sentence, a sentence of its own."""
    zh = is_chinese(language)
    pieces, last = [], 0
    for match in block.finditer(text):
        before = text[last : match.start()]
        lead = before.rstrip()
        new_line = "\n" in before[len(lead) :]
        if lead.endswith((":", "：")) or (lead[-1:].isalnum() and not new_line):
            lead = lead.removesuffix(":").removesuffix("：")
            pieces.append(lead + (f"，{phrase}。" if zh else f", {phrase}."))
        else:
            sentence = f"{phrase}。" if zh else f"{phrase[:1].upper()}{phrase[1:]}."
            pieces.append(f"{lead}{chr(10) if new_line else ' '}{sentence}" if lead else sentence)
        last = match.end()
    pieces.append(text[last:])
    return "".join(pieces)


def _say_span(text: str, start: int, end: int, source: str, language: str, dense_phrase: str, dense_words: int) -> str:
    said = _said_span(source, language, dense_phrase, dense_words)
    before, after = text[max(0, start - 40) : start], text[end : end + 1]
    if is_chinese(language):  # a space only between two Latin letters or digits
        said = _without_repeat_zh(before, said)
        left = " " if _latin(before[-1:]) and _latin(said[:1]) else ""
        right = " " if _latin(after) and _latin(said[-1:]) else ""
        return f"{left}{said}{right}"
    said = _without_repeat(before, said)
    left = " " if before[-1:].isalnum() or before[-1:] in ",.;:!?)" else ""
    right = " " if after.isalnum() or after == "(" else ""
    return f"{left}{said}{right}"


def _latin(char: str) -> bool:
    return char.isascii() and char.isalnum()


def _without_repeat_zh(before: str, said: str) -> str:
    """'向量$\\begin{pmatrix}...$' says '向量' once, '角$\\angle A$' '角' once."""
    for word in ("向量", "矩阵", "三角形", "集合", "角"):
        if said.startswith(word) and before.endswith(word):
            return said[len(word) :].lstrip("，")
    return said


def _without_repeat(before: str, said: str) -> str:
    """'the triangle $\\triangle ABC$' says 'triangle' once, 'in the set $\\{1, 2\\}$' 'the set' once."""
    told, saying = before.lower().split()[-2:], said.split()
    for size in (2, 1):
        if len(saying) > size and told[-size:] == [w.lower() for w in saying[:size]]:
            return " ".join(saying[size:])
    return said


def _said_span(source: str, language: str, dense_phrase: str, dense_words: int) -> str:
    said, boxed = say_latex(source, language)
    if len(said.split()) + (len(said) // 4 if is_chinese(language) else 0) > dense_words:
        vocab = words(language)
        answer = (
            (", " if not is_chinese(language) else "，") + vocab["answer_clause"].format(x=boxed[-1]) if boxed else ""
        )
        said = dense_phrase + answer
    return said


def say_latex(source: str, language: str = "en") -> tuple[str, list[str]]:
    """(the words of a LaTeX math source, the words of each \\boxed in it)."""
    envs: list[str] = []
    boxed: list[str] = []
    while "\\begin" in source and "\\end" in source:
        replaced = _ENV.sub(lambda m: _marker(envs, _say_environment(m, language, boxed)), source)
        if replaced == source:
            break
        source = replaced
    source = _THIN_SPACES.sub(lambda m: "" if m.group() == "\\!" else " ", source)  # '1,\\!000' is '1,000'
    reader = Reader(_TOKEN.findall(source), language, envs)
    said = _tidy(join(reader.sequence(), language))
    return said, boxed + reader.boxed


def _marker(envs: list[str], said: str) -> str:
    envs.append(said)
    return f"\x01{len(envs) - 1}\x02"


def _say_environment(match: re.Match, language: str, boxed: list[str]) -> str:
    """Rows at '\\\\', cells at '&': a matrix of one column is a vector, other environments are said row by row."""
    name, body = match.group(1), match.group(2)
    vocab = words(language)
    rows = [[_said(cell, language, boxed) for cell in row.split("&")] for row in re.split(r"\\\\(?:\[[^\]]*\])?", body)]
    rows = [[c for c in row if c] for row in rows]
    rows = [row for row in rows if row]
    comma = "，" if is_chinese(language) else ", "
    if name in _MATRICES:
        if all(len(row) == 1 for row in rows):
            return join([vocab["vector"], comma.join(row[0] for row in rows)], language)
        return join([vocab["matrix"], "; ".join(comma.join(row) for row in rows)], language)
    stop = "。" if is_chinese(language) else "."
    said = ""
    for row in rows:
        line = join(row, language).rstrip(" ,.;，。")
        if said and not _continues(line, language):
            said += stop
        said = join([said, line], language) if said else line
    return said + stop if len(rows) > 1 else said


def _continues(row: str, language: str) -> bool:
    """A row that starts with its relation ('&= 180 - ...') goes on the sentence of the row above."""
    vocab = words(language)
    return any(
        row.startswith(vocab[key])
        for key in ("equals", "le", "ge", "less", "greater", "approx", "ne", "plus", "minus", "times", "implies")
    )


def _said(source: str, language: str, boxed: list[str]) -> str:
    said, inner = say_latex(source, language)
    boxed.extend(inner)
    return said


def _tidy(text: str) -> str:
    text = re.sub(r"\s+([,.;:!?)\]，。])", r"\1", text)
    text = re.sub(r"([(\[])\s+", r"\1", text)
    text = re.sub(r"\$\s+(?=\d)", "$", text)
    return " ".join(text.split())
