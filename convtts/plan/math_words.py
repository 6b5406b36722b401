"""LaTeX math said as words: '$\\frac{x}{4} = 1$' -> 'x over 4 equals 1' (zh: '四分之x等于1').

Inline math ($...$, \\(...\\)), display math ($$...$$, \\[...\\]) and bare environments
(\\begin{align*} ... \\end{align*}) are found in a turn and each is read by a small recursive reader:
fractions, powers, roots, subscripts, Greek letters, degrees, \\boxed (its content), \\text (its
text), operators and relations as words; \\left, \\right and spacing are silent. An environment is
said row by row, its rows as sentences, a matrix of one column as a vector. A span whose spoken form
runs past a number of words is said as a phrase instead ('a long expression'), with its boxed
answer after it.

Which dollar sign opens math: the rule pandoc and most markdown math renderers use. An opening $
has a non-space character to its right, a closing one a non-space character to its left and no
digit after it, so that '$20 and $30' stays two amounts and '$4$ tickets' is math.

Drawing code between [asy] and [/asy] is never said: a phrase takes its place ('as shown in the
figure').
"""

from __future__ import annotations

import re

from convtts.plan.vocabulary import FUNCTIONS, GREEK, chinese_integer, is_chinese, join, words

# Where math opens: $$, \[, \(, \begin{env}, or a $ (inline, by the pandoc rule below).
_OPENER = re.compile(r"\$\$|\\\[|\\\(|\\begin\{([A-Za-z]+\*?)\}|(?<![\\$])\$(?![\s$])")
_CLOSERS = {"$$": "$$", "\\[": "\\]", "\\(": "\\)"}
_INLINE = re.compile(r"\$((?:[^$\\\n`]|\\.|\n(?![ \t]*\n)){1,2000}?)(?<![\s\\])\$(?!\d)")
_ASY = re.compile(r"\[asy\].*?(?:\[/asy\]|\Z)", re.S | re.I)
_ENV = re.compile(r"\\begin\{([A-Za-z]+)\*?\}(?:\{[^{}]*\})?(.*?)\\end\{\1\*?\}", re.S)
_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?|\.\d+|[A-Za-z]+|\x01\d+\x02|\s+|.", re.S)
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_CHINESE_MARKS = {",": "，", ";": "；", ".": "。"}
_THIN_SPACES = re.compile(r"\\[!,;: ]|~")
_ORDINAL = re.compile(r"(?:\\text(?:rm)?\{)?\s*(st|nd|rd|th)\}?")
_MATRICES = frozenset("matrix pmatrix bmatrix Bmatrix vmatrix Vmatrix smallmatrix".split())

_FRACTIONS = frozenset("frac dfrac tfrac cfrac".split())
_TEXT = frozenset("text mbox textrm textbf textit textsf texttt emph operatorname hbox".split())
_CONTENT = frozenset(
    "mathbf mathrm mathit mathsf mathcal mathbb mathfrak boldsymbol bm hat vec bar tilde widehat "
    "underline cancel bcancel xcancel displaystyle textstyle phantom".split()
)
_BIG = {"sum": "sum", "prod": "product", "int": "integral", "iint": "integral", "lim": "limit"}
_SYMBOLS = {
    "cdot": "times",
    "times": "times",
    "ast": "times",
    "div": "divided",
    "le": "le",
    "leq": "le",
    "leqslant": "le",
    "ge": "ge",
    "geq": "ge",
    "geqslant": "ge",
    "ne": "ne",
    "neq": "ne",
    "approx": "approx",
    "sim": "approx",
    "pm": "pm",
    "mp": "pm",
    "equiv": "equiv",
    "in": "in",
    "implies": "implies",
    "Rightarrow": "implies",
    "Longrightarrow": "implies",
    "iff": "iff",
    "Leftrightarrow": "iff",
    "to": "approaches",
    "rightarrow": "to",
    "infty": "infinity",
    "angle": "angle",
    "measuredangle": "angle",
    "triangle": "triangle",
    "circ": "degrees",
    "degree": "degrees",
    "ldots": "etc",
    "dots": "etc",
    "cdots": "etc",
    "lt": "less",
    "gt": "greater",
    "bmod": "mod",
    "mod": "mod",
    "prime": "prime",
}
_CHARS = {
    "+": "plus",
    "=": "equals",
    "<": "less",
    ">": "greater",
    "*": "times",
    "!": "factorial",
    "'": "prime",
    ":": "ratio",
}
_OPERATORS = frozenset(
    "plus minus negative times divided over equals less greater le ge ne approx pm equiv in implies iff to "
    "approaches mod ratio".split()
)


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
    reader = _Reader(_TOKEN.findall(source), language, envs)
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


class _Reader:
    """Reads a token list left to right into pieces of speech; braces are read recursively."""

    def __init__(self, tokens: list[str], language: str, envs: list[str]):
        self.tokens, self.i = tokens, 0
        self.language, self.zh = language, is_chinese(language)
        self.vocab = words(language)
        self.envs = envs
        self.boxed: list[str] = []
        self.open_bars: list[str] = []

    def sequence(self, stop: str | None = None) -> list[str]:
        out: list[str] = []
        while self.i < len(self.tokens):
            token = self.tokens[self.i]
            self.i += 1
            if token == stop:
                break
            if token == "}" and stop is None:
                continue
            self.token(token, out)
        return out

    def argument(self) -> tuple[str, list[str]]:
        """(source, pieces) of the next brace group or single token."""
        while self.i < len(self.tokens) and self.tokens[self.i].isspace():
            self.i += 1
        if self.i >= len(self.tokens):
            return "", []
        start = self.i
        if self.tokens[self.i] == "{":
            self.i += 1
            pieces = self.sequence("}")
            return "".join(self.tokens[start + 1 : self.i - 1]), pieces
        token = self.tokens[self.i]
        self.i += 1
        if token[:1].isalpha() and len(token) > 1 and not token.startswith("\\"):
            self.tokens.insert(self.i, token[1:])  # '\frac12': one digit or letter per argument
            token = token[0]
        if token[:1].isdigit() and len(token) > 1 and "." not in token and "," not in token and self._brief(start):
            self.tokens.insert(self.i, token[1:])
            token = token[0]
        out: list[str] = []
        self.token(token, out)
        return token, out

    def _brief(self, start: int) -> bool:
        """'\\frac12', '\\sqrt3': a fraction or root written without braces takes one digit."""
        return start > 0 and self.tokens[start - 1].lstrip("\\") in _FRACTIONS

    def raw_group(self) -> str:
        source, _ = self.argument()
        return source

    def token(self, token: str, out: list[str]) -> None:
        if token.isspace() or token in ("&", "~"):
            return
        if token in ("|", "\\|"):
            self.bars(token, out)
            return
        if token.startswith("\\"):
            self.command(token[1:], out)
        elif token[0].isdigit() or (token[0] == "." and token[1:].isdigit()):
            out.append(self.number(token))
        elif token[0].isalpha():
            if token[0] == "x" and out and out[-1][-1:].isdigit() and not self.zh:
                out.append(self.vocab["times"])  # wetext reads '3 x' as 'three times': '3 times x' keeps the x
            out.extend([token] if self.zh or len(token) > 4 and not token.isupper() else list(token))
            if token in ("f", "g", "h") and self.tokens[self.i : self.i + 1] == ["("] and not self.zh:
                out.append(self.vocab["of"])  # 'f(x)': 'f of x'
                if self.tokens[self.i + 2 : self.i + 3] == [")"] and not self.tokens[self.i + 1].isspace():
                    self.token(self.tokens[self.i + 1], out)
                    self.i += 3
        elif token[0] == "\x01":
            out.append(self.envs[int(token[1:-1])])
        elif token == "^":
            self.power(out)
        elif token == "_":
            self.subscript(out)
        elif token == "-":
            unary = not out or out[-1] in "([,;{" or self._is_operator(out[-1])
            out.append(self.vocab["negative" if unary else "minus"])
        elif token == "/":
            self.divide(out)
        elif token in _CHARS:
            out.append(self.vocab[_CHARS[token]])
        elif token in ",;.()[]":
            out.append(_CHINESE_MARKS.get(token, token) if self.zh else token)

    def bars(self, token: str, out: list[str]) -> None:
        """'|x|' the absolute value of x, '\\|v\\|' the norm of v: said where the bars open."""
        if self.open_bars and self.open_bars[-1] == token:
            self.open_bars.pop()
            return
        self.open_bars.append(token)
        out.append(self.vocab["norm" if token == "\\|" else "abs"])

    def _is_operator(self, piece: str) -> bool:
        return any(piece == self.vocab[key] for key in _OPERATORS)

    def number(self, token: str) -> str:
        token = "0" + token if token.startswith(".") else token
        return token.replace(".", "点") if self.zh else token

    def command(self, name: str, out: list[str]) -> None:
        if name in _FRACTIONS:
            self.fraction(out)
        elif name == "sqrt":
            self.root(out)
        elif name == "boxed":
            _, pieces = self.argument()
            self.boxed.append(join(pieces, self.language))
            out.extend(pieces)
        elif name in _TEXT:
            out.append(self.raw_group().strip())
        elif name in _CONTENT:
            out.extend(self.argument()[1])
        elif name == "overline":
            self.overline(out)
        elif name == "cancelto":
            self.argument()
            out.extend(self.argument()[1])
        elif name == "binom":
            top, bottom = self.argument()[1], self.argument()[1]
            out.extend([*top, self.vocab["choose"], *bottom])
        elif name == "pmod":
            out.extend([self.vocab["mod"], *self.argument()[1]])
        elif name in _BIG:
            self.big(_BIG[name], out)
        elif name in _SYMBOLS:
            self.symbol(_SYMBOLS[name], out)
        elif name in GREEK:
            out.append(GREEK[name][1 if self.zh else 0])
        elif name in FUNCTIONS["en"]:
            out.append(FUNCTIONS["zh" if self.zh else "en"][name])
        elif name == "$":
            out.append("$")
        elif name == "%":
            self.percent(out)
        elif name == "{":
            out.append(self.vocab["set"])
        elif name in ("left", "right", "bigl", "bigr", "Bigl", "Bigr") and self.i < len(self.tokens):
            if self.tokens[self.i] == ".":
                self.i += 1
        elif name == "\\":
            out.append(".")
        # anything else (spacing, \left, unknown commands) is silent; its braces are read as they come

    def symbol(self, key: str, out: list[str]) -> None:
        if key == "degrees" and self.zh:
            out.append("度")
        else:
            out.append(self.vocab[key])

    def percent(self, out: list[str]) -> None:
        if self.zh and out:
            out[-1] = self.vocab["percent"] + out[-1]
        else:
            out.append(self.vocab["percent"])

    def fraction(self, out: list[str]) -> None:
        whole = self.i >= 2 and _NUMBER.fullmatch(self.tokens[self.i - 2]) and out and out[-1][:1].isdigit()
        top, bottom = self.argument()[1], self.argument()[1]
        if whole and len(top) == len(bottom) == 1 and top[0].isdigit() and bottom[0].isdigit():  # 1\frac{4}{5}
            out.append(self.vocab["and"])
        if self.zh:
            out.append(f"{_chinese(bottom, self.language)}分之{_chinese(top, self.language)}")
            return
        comma = [","] if any(self._is_operator(p) for p in top) else []  # 'a plus b, over 2'
        out.extend([*top, *comma, self.vocab["over"], *bottom])

    def root(self, out: list[str]) -> None:
        degree = ""
        if self.i < len(self.tokens) and self.tokens[self.i] == "[":
            end = self.tokens.index("]", self.i) if "]" in self.tokens[self.i :] else self.i
            degree = "".join(self.tokens[self.i + 1 : end]).strip()
            self.i = end + 1
        pieces = self.argument()[1]
        factor = (
            bool(out) and not self.zh and (out[-1][-1:].isalnum() or out[-1] == ")") and not self._is_operator(out[-1])
        )
        if factor and not degree and len(pieces) == 1:
            out.extend(["root", *pieces])  # '3\\sqrt{6}': 'three root six'
            return
        if factor:
            out.append(self.vocab["times"])
        if not degree or degree == "2":
            head = self.vocab["sqrt"]
        elif self.zh:
            head = self.vocab["root"].format(n=chinese_integer(int(degree)) if degree.isdigit() else degree)
        else:
            head = _EN_ROOTS.get(degree) or self.vocab["root"].format(n=degree)
        out.extend([head, *pieces])

    def power(self, out: list[str]) -> None:
        source, pieces = self.argument()
        source = source.strip()
        ordinal = _ORDINAL.fullmatch(source)
        if source in ("\\circ", "{\\circ}", "\\degree"):
            self.symbol("degrees", out)
        elif ordinal and out:
            out[-1] = "第" + out[-1] if self.zh else out[-1] + ordinal.group(1)
        elif source == "-1" and out and out[-1] in FUNCTIONS["zh" if self.zh else "en"].values():
            out[-1] = self.vocab["inverse"].format(f=out[-1])
        elif source in ("2", "3"):
            out.append(self.vocab["squared" if source == "2" else "cubed"])
        elif self.zh:
            out.append(self.vocab["power"].format(n=join(pieces, self.language)))
        else:
            out.extend([self.vocab["power"], *pieces] + ([","] if len(pieces) > 1 else []))

    def subscript(self, out: list[str]) -> None:
        source, pieces = self.argument()
        if out and out[-1].isdigit() and source.strip().isdigit():
            if self.zh:
                out[-1] = f"{chinese_integer(int(source))}进制的{out[-1]}"
            else:
                out.extend([self.vocab["base"], source.strip()])
            return
        out.extend([self.vocab["sub"], *pieces])

    def divide(self, out: list[str]) -> None:
        if not self.zh or not out:
            out.append(self.vocab["over"])
            return
        start = len(out) - 1
        if out[-1] == ")" and "(" in out:  # '(-7+2)/2': the whole bracket is the numerator
            start = len(out) - 1 - out[::-1].index("(")
        top = out[start:]
        del out[start:]
        _, bottom = self.argument()
        out.append(f"{_chinese(bottom, self.language)}分之{_chinese(top, self.language)}")

    def overline(self, out: list[str]) -> None:
        source, pieces = self.argument()
        if len(out) >= 2 and out[-1] == "." and out[-2][:1].isdigit() and source.strip().isdigit():
            decimal = "点" if self.zh else "."
            out[-2:] = [out[-2] + decimal + source.strip(), self.vocab["repeating"]]
            return
        out.extend(pieces)

    def big(self, key: str, out: list[str]) -> None:
        """'\\sum_{i=1}^\\infty' -> 'the sum from i equals 1 to infinity of'."""
        lower: list[str] = []
        upper: list[str] = []
        while self.i < len(self.tokens) and self.tokens[self.i] in ("_", "^", " ", "\\limits"):
            mark = self.tokens[self.i]
            self.i += 1
            if mark == "_":
                lower = self.argument()[1]
            elif mark == "^":
                upper = self.argument()[1]
        v = self.vocab
        if self.zh:
            bounds = [v["from"], *lower, v["to"], *upper] if upper else ([v["as"], *lower] if lower else [])
            out.extend([*bounds, v[key] + "，"])
            return
        if key == "limit" and lower:
            out.extend([v["limit"], v["as"], *lower, v["of"]])
        elif upper:
            out.extend([v[key], v["from"], *lower, v["to"], *upper, v["of"]])
        elif lower:
            out.extend([v[key], v["over_range"], *lower, v["of"]])
        else:
            out.extend([v[key], v["of"]])


_EN_ROOTS = {"3": "the cube root of", "4": "the fourth root of", "5": "the fifth root of"}


def _chinese(pieces: list[str], language: str) -> str:
    """An integer as Chinese numerals ('3' -> '三'), anything else as its words."""
    if len(pieces) == 1 and pieces[0].isdigit() and len(pieces[0]) <= 9:
        return chinese_integer(int(pieces[0]))
    return join(pieces, language)
