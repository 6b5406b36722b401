"""The reader of one math span's tokens: LaTeX commands, numbers, letters and marks into pieces of
speech, in English or Chinese ('\\frac{x}{4}' -> 'x over 4', '四分之x'). It is apart from math_words.py,
which finds the spans in a turn, says environments row by row and fits what is said into the sentence
around it; this module only reads a token list left to right, its braces recursively.
"""

from __future__ import annotations

import re

from convtts.plan.vocabulary import FUNCTIONS, GREEK, chinese_integer, is_chinese, join, words

_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_CHINESE_MARKS = {",": "，", ";": "；", ".": "。"}
_ORDINAL = re.compile(r"(?:\\text(?:rm)?\{)?\s*(st|nd|rd|th)\}?")

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


class Reader:
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
