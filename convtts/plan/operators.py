"""Operators between numbers, percentages, amounts of money, ranges and calculator notes said as words.

'48/2 = <<48/2=24>>24 clips' -> '48 divided by 2 equals 24 clips', '10-20 minutes' -> '10 to 20
minutes', '$3.50' -> '3 dollars and 50 cents', '#### 72' -> 'The answer is 72.' (zh: '48除以2等于24',
'10到20', '3点50美元', '答案是72。'). Digits stay digits: the voice's own frontend reads them.

Why our own rules and not a normaliser: CosyVoice's frontend runs wetext (WeTextProcessing's
grammars) when installed. Measured with wetext 0.1.8 on a 2-core machine: 16 ms a turn of English
(GSM8K answers, 274 characters on average) and 5.5 ms a turn of Chinese (alpaca_zh, 103
characters); a million conversations of two to four turns would take hours, against the planner's
four minutes. It also fails on English input with Chinese in it. The rules here only turn symbols
into words, which wetext leaves alone; numbers, times and units are still read by wetext where it
runs. On the cleaned MATH-500, GSM8K and alpaca_zh test conversations wetext dropped none of our
words and normalising twice gave what normalising once gave (but for lines with a double quote,
which wetext escapes again each pass). It reads '3 x' as 'three times', so '3x' is said '3 times x'.
Without wetext, CosyVoice spells digit runs itself ('3.5' -> 'three.five'), so a Chinese decimal is
written '3点5' here, which both read alike.

Cleaning with these rules costs 35 to 45 µs a turn of ordinary chat text on that machine (25 to 40
without them), 190 µs a GSM8K turn and 450 µs a MATH-500 turn.
"""

from __future__ import annotations

import re

from convtts.plan.vocabulary import is_chinese, join, words

_ANNOTATION = re.compile(r"<<[^<>\n]{0,300}>>")  # GSM8K's calculator note: '48/2 = <<48/2=24>>24'
_ANSWER = re.compile(r"^[ \t]*####[ \t]*(-?\$?[\d.,/]+%?|[^\s#][^\n#]{0,40}?)[ \t]*$", re.M)

_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
_OPERAND = rf"(?:\$ ?{_NUMBER}|\d+[a-z](?![\w'])|{_NUMBER}%?|\.\d+|(?<![A-Za-z0-9_'$])[a-z](?![A-Za-z0-9_']))"
_OPERATOR = r"(?:\*\*|<=|>=|[-+*/×÷=<>^≤≥≠≈·−])"
# '48/2 = 24', '3*2=6', '(n-2)/2', '100 - 50 - 30 = $5', 'x+5': operands joined by operators
_RUN = re.compile(
    rf"(?<![A-Za-z0-9_.,:/\\-])\(?-?{_OPERAND}\)?(?:[ \t]*{_OPERATOR}[ \t]*\(?-?{_OPERAND}\)?)+(?![A-Za-z0-9_/]|\.\d)"
)
_PIECE = re.compile(rf"\$ ?{_NUMBER}|\d+[a-z](?![\w'])|{_NUMBER}%?|\.\d+|\*\*|<=|>=|[a-z]|[-+*/×÷=<>^≤≥≠≈·−()]")
_TIMES_X = re.compile(r"(?<=\w) x (?=\$?\d)")  # '0.2 x 50', '$60/large painting x 8'
_TIME = r"\d{1,2}(?::\d{2})?(?: ?[ap]\.?m\.?)?"
_TIME_RANGE = re.compile(rf"(?<![A-Za-z0-9_:])({_TIME})[ \t]?[-–][ \t]?({_TIME})(?![A-Za-z0-9_:])", re.I)
_DASH_RANGE = re.compile(rf"(?<![A-Za-z0-9_.])({_NUMBER})–({_NUMBER})(?![A-Za-z0-9_]|\.\d)")
_RATIO = re.compile(r"(?<![\d:.])(\d{1,3}):(\d)(?![\d:])")  # '4:3', '16:9'; a time has two digits after the colon
_MONEY = re.compile(rf"\$ ?({_NUMBER})(?: ?(thousand|million|billion|trillion)\b)?")
_PERCENT = re.compile(rf"({_NUMBER}) ?%")
_SPACED = re.compile(r"(?<=\S) ([*×=÷+−≈≤≥≠]) (?=\S)")
_SUPERSCRIPT = re.compile("[²³]")
_SPACED_MINUS = re.compile(r"(?<=\w) [-–] (?=\$?\d)")  # '840 pieces - 825 pieces = 15 pieces'
_PER = re.compile(r"(\d[\d,.]*\s+[A-Za-z]+)/([A-Za-z]{2,})\b")  # '14 pieces/house', '1000 ml/liter'
_LEADING_POINT = re.compile(r"(?<![\w.])\.(?=\d)")  # '.75' -> '0.75'
_NEGATIVE = re.compile(r"(?<![A-Za-z0-9_)\].,:/-])-(?=\d)")  # '-40 degrees', '是-5度'; not 'F-16' or '3-4'
_STRAY_DOLLAR = re.compile(r"(?<!`)\$(?! ?\d)(?!`)")  # a math delimiter left alone; not `$` in code
_DECIMAL = re.compile(r"(?<![\d.])(\d+)\.(\d+)(?![\d.])")

_WORK = re.compile(r"\d|\s[*×=÷+−≈≤≥≠]\s|\$|[²³]")  # every rule needs a digit, a spaced operator or a dollar sign
_OTHER_SCRIPT = re.compile("[\u0400-\u1cff\u3040-\u30ff\uac00-\ud7af]")  # Cyrillic to Indic, kana, Hangul
_WORD = {
    "+": "plus",
    "−": "minus",
    "*": "times",
    "×": "times",
    "·": "times",
    "÷": "divided",
    "=": "equals",
    "<": "less",
    ">": "greater",
    "<=": "le",
    ">=": "ge",
    "≤": "le",
    "≥": "ge",
    "≠": "ne",
    "≈": "approx",
}


def speak_calculator_notes(text: str, language: str = "en") -> str:
    """GSM8K's '<<48/2=24>>' notes go (the result is written after them); '#### 72' is said as the answer."""
    if "<<" in text:
        text = _ANNOTATION.sub("", text)
    if "####" in text:
        template = words(language)["answer"]
        text = _ANSWER.sub(lambda m: template.format(x=m.group(1)), text)
    return text


def speak_operators(text: str, language: str = "en") -> str:
    """Operators between numbers, ranges, percentages and amounts of money as words; a stray '$' goes.

    A turn written in another script (Cyrillic, Arabic, kana, Hangul ...) keeps its symbols: English
    words in a Russian sentence read worse than '70–80' read by a Russian voice."""
    if not _WORK.search(text) or (not is_chinese(language) and _OTHER_SCRIPT.search(text)):
        return text
    vocab = words(language)
    if "-" in text or "–" in text:
        text = _TIME_RANGE.sub(lambda m: _range(m, vocab, language), text) if ":" in text or "m-" in text else text
        text = _DASH_RANGE.sub(lambda m: _range(m, vocab, language), text) if "–" in text else text
    if ":" in text:
        text = _RATIO.sub(lambda m: join([m.group(1), vocab["ratio"], m.group(2)], language), text)
    if " x " in text:
        text = _TIMES_X.sub(" × ", text)
    if (" - " in text or " – " in text) and "=" in text:
        text = "\n".join(_SPACED_MINUS.sub(" − ", line) if "=" in line else line for line in text.split("\n"))
    if "." in text:
        text = _LEADING_POINT.sub("0.", text)
    if any(mark in text for mark in "-+*/×÷=<>^≤≥≠≈·−"):
        text = _RUN.sub(lambda m: _say_run(m.group(), language), text)
        if " " in text:
            gap = "" if is_chinese(language) else " "
            text = _SPACED.sub(lambda m: f"{gap}{vocab[_WORD[m.group(1)]]}{gap}", text)
        if "-" in text:
            text = _NEGATIVE.sub(vocab["negative"] + ("" if is_chinese(language) else " "), text)
    if ("²" in text or "³" in text) and not is_chinese(language):  # CosyVoice's Chinese frontend says these itself
        text = _SUPERSCRIPT.sub(lambda m: " " + vocab["squared" if m.group() == "²" else "cubed"], text)
    if "%" in text:
        text = _PERCENT.sub(lambda m: _percent(m.group(1), language), text)
    if "$" in text:
        text = _MONEY.sub(lambda m: say_money(m.group(1), m.group(2), language), text)
        text = _STRAY_DOLLAR.sub("", text)
    if "/" in text:
        text = _PER.sub(lambda m: join([m.group(1), vocab["per"], m.group(2)], language), text)
    if is_chinese(language) and "." in text:
        text = _DECIMAL.sub(r"\1点\2", text)
    return text


def _range(match: re.Match, vocab: dict[str, str], language: str) -> str:
    if match.re is _TIME_RANGE and not any(":" in side or "m" in side.lower() for side in match.groups()):
        return match.group()  # '50 - 30': numbers, read as a subtraction below
    return join([match.group(1), vocab["to"], match.group(2)], language)


def _say_run(run: str, language: str) -> str:
    pieces = _PIECE.findall(run)
    operators = [p for p in pieces if p in _WORD or p in "-/^**"]
    if _kept_as_written(pieces, operators, run):
        return run
    vocab = words(language)
    zh = is_chinese(language)
    relation = any(p in ("=", "<", ">", "<=", ">=", "≤", "≥", "≠", "≈") for p in pieces)
    spoken_operators = _SPOKEN_OPERATORS[id(vocab)]
    out: list[str] = []
    power = False
    for i, piece in enumerate(pieces):
        unary = not out or out[-1] == "(" or out[-1] in spoken_operators
        if power:
            power = False
            if piece in ("2", "3"):
                out.append(vocab["squared" if piece == "2" else "cubed"])
                continue
            if zh:
                out.append(vocab["power"].format(n=piece))
                continue
        if piece == "-" and operators == ["-"] and not relation and _bare_range(pieces, run):
            out.append(vocab["to"])
        elif piece == "-":
            out.append(vocab["negative" if unary else "minus"])
        elif piece == "/":
            out.append(vocab["divided" if relation or zh else "over"])
        elif piece in ("^", "**"):
            power = True
            if not zh and pieces[i + 1 : i + 2] not in (["2"], ["3"]):
                out.append(vocab["power"])
        elif piece in _WORD:
            out.append(vocab[_WORD[piece]])
        elif piece.startswith("$"):
            out.append(say_money(piece.lstrip("$ "), None, language))
        elif piece[-1] == "x" and piece[0].isdigit() and not zh:
            out.extend([piece[:-1], vocab["times"], "x"])  # '3x' read by wetext is 'three times'; keep the x
        elif piece.endswith("%"):
            out.append(_percent(piece[:-1], language))
        else:
            out.append(piece)
    return join(out, language).replace("( ", "(").replace(" )", ")")


def _kept_as_written(pieces: list[str], operators: list[str], run: str) -> bool:
    """'24/7', dates and numbers like '2024-01-03' or '12/25/2024', and runs without a digit stay."""
    if not any(ch.isdigit() for ch in run) or run in ("24/7", "9/11", "50/50"):
        return True
    return len(operators) >= 2 and len(set(operators)) == 1 and operators[0] in "-/" and " " not in run


def _bare_range(pieces: list[str], run: str) -> bool:
    """'10-20', '3-4': two numbers around a hyphen without spaces are a range, not a subtraction."""
    return len(pieces) == 3 and " " not in run and all(p[0].isdigit() for p in (pieces[0], pieces[2]))


_OPERATOR_KEYS = ("plus", "minus", "times", "divided", "over", "equals", "less", "greater", "le", "ge", "negative")
_SPOKEN_OPERATORS = {id(table): frozenset(table[key] for key in _OPERATOR_KEYS) for table in (words("en"), words("zh"))}


def _percent(number: str, language: str) -> str:
    if is_chinese(language):
        return "百分之" + number
    return f"{number} percent"


def say_money(number: str, scale: str | None, language: str) -> str:
    """'20' -> '20 dollars', '1' -> '1 dollar', '3.50' -> '3 dollars and 50 cents', '0.75' -> '75 cents'
    (zh: '20美元')."""
    vocab = words(language)
    if is_chinese(language):
        return join([number.replace(".", "点") + (scale or ""), vocab["dollars"]], language)
    if scale:
        return f"{number} {scale} dollars"
    whole, _, cents = number.partition(".")
    unit = vocab["dollar"] if whole == "1" else vocab["dollars"]
    if len(cents) != 2:
        return f"{number} {vocab['dollar'] if number == '1' else vocab['dollars']}"
    cents = cents.lstrip("0") or "0"
    cent_words = f"{cents} {vocab['cent'] if cents == '1' else vocab['cents']}"
    if whole in ("0", ""):
        return cent_words
    if cents == "0":
        return f"{whole} {unit}"
    return f"{whole} {unit} and {cent_words}"
