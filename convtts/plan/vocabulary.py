"""The words that math, operators and bridges are said with, in English and Chinese.

Every language other than Chinese is given the English words: a voice of another language reads
an English operator more easily than a symbol.
"""

from __future__ import annotations

EN = {
    "plus": "plus",
    "minus": "minus",
    "negative": "minus",
    "times": "times",
    "divided": "divided by",
    "over": "over",
    "equals": "equals",
    "less": "is less than",
    "greater": "is greater than",
    "le": "is less than or equal to",
    "ge": "is greater than or equal to",
    "ne": "is not equal to",
    "approx": "is approximately",
    "pm": "plus or minus",
    "equiv": "is congruent to",
    "mod": "modulo",
    "in": "in",
    "implies": "which implies",
    "iff": "if and only if",
    "to": "to",
    "approaches": "approaches",
    "infinity": "infinity",
    "angle": "angle",
    "triangle": "triangle",
    "degrees": "degrees",
    "percent": "percent",
    "squared": "squared",
    "cubed": "cubed",
    "power": "to the power of",
    "sqrt": "the square root of",
    "root": "the {n}th root of",
    "sub": "sub",
    "base": "base",
    "choose": "choose",
    "factorial": "factorial",
    "prime": "prime",
    "repeating": "repeating",
    "etc": "and so on",
    "and": "and",
    "ratio": "to",
    "set": "the set",
    "vector": "the vector",
    "matrix": "the matrix with rows",
    "sum": "the sum",
    "product": "the product",
    "integral": "the integral",
    "limit": "the limit",
    "from": "from",
    "over_range": "over",
    "of": "of",
    "as": "as",
    "inverse": "inverse {f}",
    "dollar": "dollar",
    "dollars": "dollars",
    "cent": "cent",
    "cents": "cents",
    "answer": "The answer is {x}.",
    "answer_clause": "and the answer is {x}",
    "code_phrase": "as shown in the code",
    "figure_phrase": "as shown in the figure",
    "dense_math_phrase": "a long expression",
    "inline_code": "this code",
    "dot": "dot",
    "per": "per",
    "norm": "the norm of",
    "abs": "the absolute value of",
}

ZH = {
    "plus": "加",
    "minus": "减",
    "negative": "负",
    "times": "乘以",
    "divided": "除以",
    "over": "分之",
    "equals": "等于",
    "less": "小于",
    "greater": "大于",
    "le": "小于等于",
    "ge": "大于等于",
    "ne": "不等于",
    "approx": "约等于",
    "pm": "正负",
    "equiv": "同余于",
    "mod": "模",
    "in": "属于",
    "implies": "推出",
    "iff": "当且仅当",
    "to": "到",
    "approaches": "趋于",
    "infinity": "无穷大",
    "angle": "角",
    "triangle": "三角形",
    "degrees": "度",
    "percent": "百分之",
    "squared": "的平方",
    "cubed": "的立方",
    "power": "的{n}次方",
    "sqrt": "根号",
    "root": "{n}次根号",
    "sub": "下标",
    "base": "进制",
    "choose": "选",
    "factorial": "的阶乘",
    "prime": "撇",
    "repeating": "循环",
    "etc": "等等",
    "and": "又",
    "ratio": "比",
    "set": "集合",
    "vector": "向量",
    "matrix": "矩阵，各行为",
    "sum": "求和",
    "product": "求积",
    "integral": "积分",
    "limit": "极限",
    "from": "从",
    "over_range": "取遍",
    "of": "",
    "as": "当",
    "inverse": "反{f}",
    "dollar": "美元",
    "dollars": "美元",
    "cent": "美分",
    "cents": "美分",
    "answer": "答案是{x}。",
    "answer_clause": "答案是{x}",
    "code_phrase": "如代码所示",
    "figure_phrase": "如图所示",
    "dense_math_phrase": "一个很长的算式",
    "inline_code": "这段代码",
    "dot": "点",
    "per": "每",
    "norm": "范数",
    "abs": "绝对值",
}

# \sin, \cos ... said as their names; a speaker says 'sine theta', not 'sin theta'.
FUNCTIONS = {
    "en": {
        "sin": "sine",
        "cos": "cosine",
        "tan": "tangent",
        "cot": "cotangent",
        "sec": "secant",
        "csc": "cosecant",
        "log": "log",
        "ln": "natural log",
        "exp": "exp",
        "max": "max",
        "min": "min",
        "gcd": "gcd",
        "lcm": "lcm",
        "det": "determinant",
        "arcsin": "arcsine",
        "arccos": "arccosine",
        "arctan": "arctangent",
    },
    "zh": {
        "sin": "正弦",
        "cos": "余弦",
        "tan": "正切",
        "cot": "余切",
        "sec": "正割",
        "csc": "余割",
        "log": "对数",
        "ln": "自然对数",
        "exp": "指数",
        "max": "最大值",
        "min": "最小值",
        "gcd": "最大公约数",
        "lcm": "最小公倍数",
        "det": "行列式",
        "arcsin": "反正弦",
        "arccos": "反余弦",
        "arctan": "反正切",
    },
}

GREEK = {
    "alpha": ("alpha", "阿尔法"),
    "beta": ("beta", "贝塔"),
    "gamma": ("gamma", "伽马"),
    "delta": ("delta", "德尔塔"),
    "epsilon": ("epsilon", "艾普西龙"),
    "varepsilon": ("epsilon", "艾普西龙"),
    "zeta": ("zeta", "泽塔"),
    "eta": ("eta", "伊塔"),
    "theta": ("theta", "西塔"),
    "vartheta": ("theta", "西塔"),
    "iota": ("iota", "约塔"),
    "kappa": ("kappa", "卡帕"),
    "lambda": ("lambda", "兰姆达"),
    "mu": ("mu", "缪"),
    "nu": ("nu", "纽"),
    "xi": ("xi", "克西"),
    "pi": ("pi", "派"),
    "rho": ("rho", "柔"),
    "sigma": ("sigma", "西格玛"),
    "tau": ("tau", "陶"),
    "upsilon": ("upsilon", "宇普西龙"),
    "phi": ("phi", "斐"),
    "varphi": ("phi", "斐"),
    "chi": ("chi", "希"),
    "psi": ("psi", "普西"),
    "omega": ("omega", "欧米伽"),
    "Gamma": ("capital gamma", "大伽马"),
    "Delta": ("capital delta", "大德尔塔"),
    "Theta": ("capital theta", "大西塔"),
    "Lambda": ("capital lambda", "大兰姆达"),
    "Pi": ("capital pi", "大派"),
    "Sigma": ("capital sigma", "大西格玛"),
    "Phi": ("capital phi", "大斐"),
    "Omega": ("capital omega", "大欧米伽"),
}


def words(language: str) -> dict[str, str]:
    """The word table of a language (ISO 639-1): Chinese for 'zh', English for every other."""
    return ZH if is_chinese(language) else EN


def is_chinese(language: str) -> bool:
    """'zh', 'zh-Hans', 'zh_TW'."""
    return language[:2].lower() == "zh" and language[2:3] in ("", "-", "_")


_DIGITS = "零一二三四五六七八九"
_UNITS = ((10**8, "亿"), (10**4, "万"), (1000, "千"), (100, "百"), (10, "十"))


def chinese_integer(number: int, leading: bool = True) -> str:
    """2 -> '二', 12 -> '十二', 105 -> '一百零五', 20000 -> '二万'."""
    if number < 10:
        return _DIGITS[number]
    for unit, name in _UNITS:
        if number >= unit:
            high, rest = divmod(number, unit)
            head = "" if unit == 10 and high == 1 and leading else chinese_integer(high, leading)
            if rest == 0:
                return head + name
            gap = "零" if rest < unit // 10 else ""
            return head + name + gap + chinese_integer(rest, leading=False)
    return str(number)


def join(pieces: list[str], language: str) -> str:
    """Words joined as the language writes them: spaces in English; in Chinese only between two Latin
    letters or digits."""
    pieces = [p for p in pieces if p]
    if not is_chinese(language):
        return " ".join(pieces)
    out = ""
    for piece in pieces:
        if out and (out[-1].isascii() and out[-1].isalnum()) and (piece[0].isascii() and piece[0].isalnum()):
            out += " "
        out += piece
    return out
