"""Segments of Chinese, Japanese and Korean text, measured in characters (English: textclean.split_segments).

A turn is cut at sentence marks first (。！？ and . ! ? before a space), a sentence still longer than
the cap at clause marks (，；、： and , ; : before a space), and a clause still longer into nearly
equal runs, between two Han or kana characters or at a space: never inside an embedded English
word or a number ("Python 3.12", "2023年"). Only a single token longer than the cap (a long
identifier) is cut inside it: no segment is ever longer than the cap.
"""

from __future__ import annotations

import math
import re

from convtts.config import MAX_CHARS_CEILING

_IDEOGRAPHIC = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ebef"
_CJK_PUNCT = "\u3000-\u303f\uff00-\uffef"  # 。，、「」 and the full-width forms
_WIDE = re.compile(f"[{_IDEOGRAPHIC}{_CJK_PUNCT}]")  # Korean keeps its spaces
# A sentence ends after 。！？ (and closing quotes), or after . ! ? that a space, the end or a CJK
# character follows ('3.14' and 'Node.js' go on).
_SENTENCE_END = re.compile(f"(?:[。！？!?…]+|(?<!\\d)\\.(?=\\s|$|[{_IDEOGRAPHIC}]))[”’\"'」』）)\\]]*\\s*")
_CLAUSE_END = re.compile(f"(?:[，；、：]|[,;:](?=\\s|$|[{_IDEOGRAPHIC}]))[”’\"'」』）)\\]]*\\s*")
# Cutting points inside a clause: each Han or kana character stands alone; any other run of
# non-space characters (an English word, a number, a Korean word) is one piece, with its spaces.
_ATOM = re.compile(f"[{_IDEOGRAPHIC}{_CJK_PUNCT}]\\s*|[^\\s{_IDEOGRAPHIC}{_CJK_PUNCT}]+\\s*|\\s+")


def split_characters(text: str, max_chars: int) -> list[str]:
    """Cleaned CJK text as segments of at most max_chars characters (never over MAX_CHARS_CEILING)."""
    cap = min(max_chars, MAX_CHARS_CEILING)
    lines = _stop_lines([" ".join(line.split()) for line in text.split("\n") if line.strip()])
    if sum(len(line) for line in lines) + len(lines) - 1 <= cap:
        return [_join(lines)] if lines else []
    units: list[str] = []
    for line in lines:
        for sentence in _pieces(_SENTENCE_END, line):
            units.extend([sentence] if len(sentence) <= cap else _split_sentence(sentence, cap))
    return _pack(units, cap)


def _stop_lines(lines: list[str]) -> list[str]:
    """A heading or list item ends in a full stop, so that the voice pauses before the next line."""
    out = []
    for i, line in enumerate(lines):
        if i < len(lines) - 1 and line[-1].isalnum():
            line += "。" if _WIDE.match(line[-1]) else "."
        out.append(line)
    return out


def _pieces(pattern: re.Pattern, text: str) -> list[str]:
    """text cut after each match of pattern (the mark stays with what it ends)."""
    out, start = [], 0
    for m in pattern.finditer(text):
        if m.end() > start:
            out.append(text[start : m.end()].strip())
            start = m.end()
    out.append(text[start:].strip())
    return [piece for piece in out if piece]


def _split_sentence(sentence: str, cap: int) -> list[str]:
    pieces = []
    for clause in _pack(_pieces(_CLAUSE_END, sentence), cap):
        pieces.extend([clause] if len(clause) <= cap else _split_clause(clause, cap))
    return pieces


def _split_clause(clause: str, cap: int) -> list[str]:
    """Runs of nearly equal length, cut only between atoms (_ATOM); an atom over the cap is cut itself."""
    atoms = []
    for atom in _ATOM.findall(clause):
        atoms.extend(atom[i : i + cap] for i in range(0, len(atom), cap))
    target = len(clause) / math.ceil(len(clause) / cap)
    runs, current = [], ""
    for atom in atoms:
        if current and (len(current) + len(atom.rstrip()) > cap or len(current) >= target):
            runs.append(current.strip())
            current = ""
        current += atom
    runs.append(current.strip())
    return [run for run in runs if run]


def _pack(units: list[str], cap: int) -> list[str]:
    """Consecutive units joined while the whole stays within cap; a longer unit stands alone."""
    out: list[str] = []
    current: list[str] = []
    length = 0
    for unit in units:
        joined = length + _gap(current[-1], unit) + len(unit) if current else len(unit)
        if current and joined > cap:
            out.append(_join(current))
            current, joined = [], len(unit)
        current.append(unit)
        length = joined
    if current:
        out.append(_join(current))
    return out


def _gap(left: str, right: str) -> int:
    """No space where either side is a wide (CJK) character; one between two Latin pieces."""
    return 0 if _WIDE.match(left[-1]) or _WIDE.match(right[0]) else 1


def _join(pieces: list[str]) -> str:
    out = pieces[0]
    for piece in pieces[1:]:
        out += " " * _gap(out, piece) + piece
    return out
