"""How math, operators, numbers, money and code are said: a table of input -> spoken text, in English
and Chinese, and what cleaning leaves of real competition math and grade-school word problems."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from convtts.config import ConfigError, load_config
from convtts.plan.conversation import plan_conversation
from convtts.plan.textclean import clean, split_segments

DATA = Path(__file__).parent / "data"

ENGLISH = [
    ("The answer is $\\boxed{10}$.", "The answer is 10."),
    ("Evaluate $\\frac{0.00006}{58.5}$ now.", "Evaluate 0.00006 over 58.5 now."),
    ("So $x = \\dfrac{3}{4}$ here.", "So x equals 3 over 4 here."),
    ("It is $\\tfrac12$ of it.", "It is 1 over 2 of it."),
    ("Thus $\\frac{a+b}{2}$ is the mean.", "Thus a plus b, over 2 is the mean."),
    ("We get $x^2 + y^3 = z^n$.", "We get x squared plus y cubed equals z to the power of n."),
    ("Then $2^{10} = 1024$.", "Then 2 to the power of 10 equals 1024."),
    (
        "Take $\\sqrt{16} = 4$ and $\\sqrt[3]{27} = 3$.",
        "Take the square root of 16 equals 4 and the cube root of 27 equals 3.",
    ),
    ("So $AB = 3\\sqrt{6}$.", "So A B equals 3 root 6."),
    ("Let $\\alpha + \\beta = \\pi$.", "Let alpha plus beta equals pi."),
    ("The angle is $45^\\circ$.", "The angle is 45 degrees."),
    ("Since $\\angle A = 14^\\circ$, we stop.", "Since angle A equals 14 degrees, we stop."),
    ("It costs $1200\\text{ lire}$ there.", "It costs 1200 lire there."),
    ("We have $3 \\cdot 4 = 12$ and $6 \\times 7 = 42$.", "We have 3 times 4 equals 12 and 6 times 7 equals 42."),
    ("Then $12 \\div 4 = 3$.", "Then 12 divided by 4 equals 3."),
    (
        "So $x \\le 5$, $y \\ge 2$ and $z \\ne 0$.",
        "So x is less than or equal to 5, y is greater than or equal to 2 and z is not equal to 0.",
    ),
    ("Roughly $\\pi \\approx 3.14$.", "Roughly pi is approximately 3.14."),
    ("The roots are $x = 3 \\pm 2\\sqrt{2}$.", "The roots are x equals 3 plus or minus 2 root 2."),
    ("The sum $\\sum_{i=1}^{n} i$ grows.", "The sum from i equals 1 to n of i grows."),
    ("The area $\\int_0^1 x\\,dx$ is small.", "The area the integral from 0 to 1 of x d x is small."),
    ("Here $a_1 = 2$ and $a_{n+1} = 3$.", "Here a sub 1 equals 2 and a sub n plus 1 equals 3."),
    ("$\\left( \\frac{1}{2} \\right)^2 = \\frac14$", "(1 over 2) squared equals 1 over 4"),
    ("The vector $\\mathbf{v}$ is long.", "The vector v is long."),
    ("As $x \\to \\infty$ it fails.", "As x approaches infinity it fails."),
    ("One ticket costs $\\$20$ at full price.", "One ticket costs 20 dollars at full price."),
    ("She paid $\\$80 * .75 = \\$60.$", "She paid 80 dollars times 0.75 equals 60 dollars."),
    ("A $25\\%$ discount applies.", "A 25 percent discount applies."),
    ("Pam paid $\\$70 - \\$60 = \\$\\boxed{10}$ more.", "Pam paid 70 dollars minus 60 dollars equals 10 dollars more."),
    ("Costs $20 and $30 each.", "Costs 20 dollars and 30 dollars each."),
    ("It is $4$ tickets.", "It is 4 tickets."),
    ("$$10^x = 10000.$$If so, stop.", "10 to the power of x equals 10000. If so, stop."),
    ("We have \\[x + 1 = 2.\\] Then done.", "We have x plus 1 equals 2. Then done."),
    ("By \\(x = 1\\) we are done.", "By x equals 1 we are done."),
    ("\\begin{align*}\na &= b + c \\\\\n&= 4.\n\\end{align*}", "a equals b plus c equals 4."),
    (
        "\\[\\begin{cases} x & \\text{if } x > 0 \\\\ 0 & \\text{otherwise} \\end{cases}\\]",
        "x if x is greater than 0. 0 otherwise.",
    ),
    ("Let $v = \\begin{pmatrix} 3 \\\\ -10 \\\\ 1 \\end{pmatrix}$.", "Let v equals the vector 3, minus 10, 1."),
    (
        "Here $M = \\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$ holds.",
        "Here M equals the matrix with rows 1, 2; 3, 4 holds.",
    ),
    ("So $0.\\overline{3} = \\frac{1}{3}$.", "So 0.3 repeating equals 1 over 3."),
    ("That is $\\binom{4}{2} = 6$ ways.", "That is 4 choose 2 equals 6 ways."),
    ("So $997 \\equiv -3 \\pmod{1000}$.", "So 997 is congruent to minus 3 modulo 1000."),
    ("The $2003^{\\text{rd}}$ term.", "The 2003rd term."),
    ("It is $1\\frac{4}{5}$ units.", "It is 1 and 4 over 5 units."),
    (
        "Then $\\|\\mathbf{v}\\| = 7$ and $|x| = 2$.",
        "Then the norm of v equals 7 and the absolute value of x equals 2.",
    ),
    ("Let $f(x) = 2x - 3$.", "Let f of x equals 2 times x minus 3."),
    ("So $\\sin^2 \\theta + \\cos^2 \\theta = 1$.", "So sine squared theta plus cosine squared theta equals 1."),
    ("Then $\\tan^{-1} x$ is small.", "Then inverse tangent x is small."),
    ("The set $\\{1, 2, \\ldots, 9\\}$ is finite.", "The set 1, 2, and so on, 9 is finite."),
    ("It is $100000000_{2}$ in binary.", "It is 100000000 base 2 in binary."),
    (
        "See the boundary:[asy]draw((0,0)--(1,1));[/asy] Then go on.",
        "See the boundary, as shown in the figure. Then go on.",
    ),
    ("The figure. [asy]\ndraw(A--B);\n[/asy]\nNext line.", "The figure. As shown in the figure.\nNext line."),
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.", "Natalia sold 48 divided by 2 equals 24 clips in May."),
    ("He earned 0.2 x 50 = $<<0.2*50=10>>10.", "He earned 0.2 times 50 equals 10 dollars."),
    (
        "Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.",
        "Betty needs 100 minus 50 minus 30 minus 15 equals 5 dollars more.",
    ),
    ("Natalia sold 72 clips.\n#### 72", "Natalia sold 72 clips.\nThe answer is 72."),
    ("He writes 3*2=<<3*2=6>>6 pages a week", "He writes 3 times 2 equals 6 pages a week"),
    ("5 copies * $20 each", "5 copies times 20 dollars each"),
    ("So (n-2)/2 is the count.", "So (n minus 2) over 2 is the count."),
    ("It takes 10-20 minutes.", "It takes 10 to 20 minutes."),
    ("Open 1:00-1:50pm daily.", "Open 1:00 to 1:50pm daily."),
    ("Shops open 9am-5pm.", "Shops open 9am to 5pm."),
    ("Pages 10–20 are missing.", "Pages 10 to 20 are missing."),
    ("The score was 3-1 to us.", "The score was 3 to 1 to us."),
    ("She spent S + 143 in total.", "She spent S plus 143 in total."),
    ("There are 80/100 * 10 = 8 more.", "There are 80 divided by 100 times 10 equals 8 more."),
    ("That is 2^6 ways, and x^2 too.", "That is 2 to the power of 6 ways, and x squared too."),
    ("Check that 5 < 6 and 7 > 3.", "Check that 5 is less than 6 and 7 is greater than 3."),
    ("Take 14 pieces/house for 60 houses.", "Take 14 pieces per house for 60 houses."),
    ("So 840 pieces - 825 pieces = 15 pieces", "So 840 pieces minus 825 pieces equals 15 pieces"),
    ("Save 50% today.", "Save 50 percent today."),
    ("Prices rise 2.5% a year.", "Prices rise 2.5 percent a year."),
    ("It costs $3.50 today.", "It costs 3 dollars and 50 cents today."),
    ("A pack costs $0.75 now.", "A pack costs 75 cents now."),
    ("He owes $1 only.", "He owes 1 dollar only."),
    ("It sold for $1.5 million last year.", "It sold for 1.5 million dollars last year."),
    ("Born on 2024-01-03 in town.", "Born on 2024-01-03 in town."),
    ("It is -40 degrees outside.", "It is minus 40 degrees outside."),
    ("A 3-year-old and an F-16.", "A 3-year-old and an F-16."),
    ("Call `print()` and `np.array` now.", "Call print and np dot array now."),
    ("Use `os.path.join` there.", "Use os dot path dot join there."),
    (
        "This program will output:\n```\nhello\n```\nKeep in mind that it loops.",
        "This program will output, as shown in the code.\nKeep in mind that it loops.",
    ),
    ("Here is the code\n```python\nx = 1\n```\nThat is all.", "Here is the code\nAs shown in the code.\nThat is all."),
    ("# Results\n## Step 1: Add\n- Mix the flour (about 200 g)", "Results\nStep 1: Add\nMix the flour (about 200 g)"),
    ("He paid 3 * $4 = $12.", "He paid 3 times 4 dollars equals 12 dollars."),
    ("Use x = 3 here.", "Use x equals 3 here."),
    ("Area = πr² and V = s³ here.", "Area equals πr squared and V equals s cubed here."),
    ("Match `$` at the end.", "Match this code at the end."),
    ("The ratio is 4:3 at 10:30.", "The ratio is 4 to 3 at 10:30."),
    ("It drove 23 total meters – 13 meters = 10 meters.", "It drove 23 total meters minus 13 meters equals 10 meters."),
]

CHINESE = [
    ("答案是$\\boxed{10}$。", "答案是10。"),
    ("所以$x = \\frac{2}{3}$。", "所以x等于三分之二。"),
    ("计算$\\dfrac{1}{8}$。", "计算八分之一。"),
    ("得到$\\frac{a+b}{2}$。", "得到二分之a加b。"),
    ("因为$x^2 = 4$，", "因为x的平方等于4，"),
    ("所以$y^3 = 8$。", "所以y的立方等于8。"),
    ("即$2^{10} = 1024$。", "即2的10次方等于1024。"),
    ("所以$\\sqrt{16} = 4$。", "所以根号16等于4。"),
    ("又$\\sqrt[3]{27} = 3$。", "又三次根号27等于3。"),
    ("其中$3 \\times 4 = 12$。", "其中3乘以4等于12。"),
    ("其中$3 \\cdot 4 = 12$。", "其中3乘以4等于12。"),
    ("且$12 \\div 4 = 3$。", "且12除以4等于3。"),
    ("角$A = 30^\\circ$。", "角A等于30度。"),
    ("已知$x \\le 5$。", "已知x小于等于5。"),
    ("已知$x \\ge 2$且$x \\ne 3$。", "已知x大于等于2且x不等于3。"),
    ("约为$\\pi \\approx 3.14$。", "约为派约等于3点14。"),
    ("打$25\\%$的折扣。", "打百分之25的折扣。"),
    ("是$1\\frac{4}{5}$个单位。", "是1又五分之四个单位。"),
    ("得$x = 3 \\pm 2\\sqrt{2}$。", "得x等于3正负2根号2。"),
    ("有$\\sin \\theta = \\frac{1}{2}$。", "有正弦西塔等于二分之一。"),
    ("$h = (-7 + 2)/2 = -5/2$", "h等于二分之(负7加2)等于负二分之五"),
    ("总价$\\$20$。", "总价20美元。"),
    ("$$x + 1 = 2.$$所以成立。", "x加1等于2。所以成立。"),
    ("由\\[a_1 = 2\\]可知。", "由a下标1等于2可知。"),
    ("等式\\begin{align*} a &= b \\\\ &= 4 \\end{align*}成立。", "等式a等于b等于4。成立。"),
    ("向量$\\begin{pmatrix} 3 \\\\ -1 \\end{pmatrix}$。", "向量3，负1。"),
    ("如图：[asy]draw((0,0)--(1,1));[/asy]", "如图，如图所示。"),
    ("她卖了48/2 = <<48/2=24>>24个。\n#### 72", "她卖了48除以2等于24个。\n答案是72。"),
    ("3*2=<<3*2=6>>6页", "3乘以2等于6页"),
    ("共有100 - 50 - 30 = 20本。", "共有100减50减30等于20本。"),
    ("用时10-20分钟。", "用时10到20分钟。"),
    ("打50%的折扣。", "打百分之50的折扣。"),
    ("价格是3.5元。", "价格是3点5元。"),
    ("花了$20买书。", "花了20美元买书。"),
    ("x^2的值。", "x的平方的值。"),
    ("温度是-5度。", "温度是负5度。"),
    ("程序输出如下：\n```\nhello\n```\n请注意循环。", "程序输出如下，如代码所示。\n请注意循环。"),
    ("调用`print()`即可。", "调用print即可。"),
    ("运行`ls -la | grep log`查看。", "运行这段代码查看。"),
    ("比较5 < 6。", "比较5小于6。"),
    ("面积 = π × 半径²", "面积等于π乘以半径²"),
    ("面积 ≈ 78.5", "面积约等于78点5"),
    ("增长率达到8.7%。", "增长率达到百分之8点7。"),
    ("总时间是40 * 52 = 2080个小时。", "总时间是40乘以52等于2080个小时。"),
    ("比例是4:3。", "比例是4比3。"),
]


@pytest.mark.parametrize("raw, expected", ENGLISH)
def test_said_in_english(raw, expected):
    assert clean(raw) == (expected, None)


@pytest.mark.parametrize("raw, expected", CHINESE)
def test_said_in_chinese(raw, expected):
    assert clean(raw, language="zh") == (expected, None)


@pytest.mark.parametrize("language", ["de", "fr", "ja-JP"])
def test_a_language_without_its_own_words_is_given_the_english_ones(language):
    assert clean(r"So $x = \frac{3}{4}$, 10-20 minutes.", language=language) == (
        "So x equals 3 over 4, 10 to 20 minutes.",
        None,
    )


def _turns(name: str) -> list[tuple[str, str, str]]:
    records = json.loads((DATA / name).read_text(encoding="utf-8"))
    return [(r["id"], t["from"], t["value"]) for r in records for t in r["conversations"]]


REAL_TURNS = _turns("math500_latex40.json") + _turns("gsm8k_train40.json")
# What a voice would read as a symbol: a backslash, a dollar sign (money is said in words), the
# calculator notes' brackets, markdown emphasis and headings, a bare asterisk.
_UNSPEAKABLE = re.compile(r"\\|\$|<<|>>|\*|#")


@pytest.mark.parametrize("language", ["en", "zh"])
def test_real_math_and_word_problems_leave_no_symbol_a_voice_would_read(language):
    assert len(REAL_TURNS) == 160
    for conversation, side, raw in REAL_TURNS:
        text, reason = clean(raw, language=language)
        assert reason is None, (conversation, side)
        assert not _UNSPEAKABLE.search(text), (conversation, side, _UNSPEAKABLE.search(text).group(), text)


def test_every_boxed_answer_and_every_final_answer_is_said():
    said = 0
    for conversation, _, raw in REAL_TURNS:
        text, _ = clean(raw)
        boxed = re.findall(r"\\boxed\{(\d+)\}", raw)
        final = re.findall(r"^#### (\d+)$", raw, re.M)
        for answer in boxed:
            assert re.search(rf"\b{answer}\b", text), (conversation, answer)
        for answer in final:
            assert text.endswith(f"The answer is {answer}."), (conversation, text[-60:])
        said += len(boxed) + len(final)
    assert said >= 60


def test_calculator_notes_are_said_once():
    for conversation, _, raw in _turns("gsm8k_train40.json"):
        text, _ = clean(raw)
        for note in re.findall(r"<<([^<>]+)>>", raw):
            result = note.split("=")[-1]
            assert note not in text and f"{result} {result}" not in text, (conversation, note)


@pytest.mark.parametrize("language", ["en", "zh"])
def test_cleaning_what_was_cleaned_changes_nothing(language):
    """Said text holds no rule's input: cleaning it again (as a frontend run twice would) keeps every word."""
    for conversation, _, raw in REAL_TURNS:
        once, _ = clean(raw, language=language)
        assert clean(once, language=language) == (once, None), conversation


def test_real_turns_clean_fast():
    start = time.perf_counter()
    for _, _, raw in REAL_TURNS * 5:
        clean(raw)
    assert (time.perf_counter() - start) / (len(REAL_TURNS) * 5) < 0.005  # a few hundred microseconds a turn here


@pytest.mark.parametrize(
    "text, max_words, expected",
    [
        ("We test each value of n. Then we stop here.", 6, ["We test each value of n.", "Then we stop here."]),
        ("Solve for x. The answer follows.", 4, ["Solve for x.", "The answer follows."]),
        ("I met J. Smith today. We ate well.", 5, ["I met J. Smith today.", "We ate well."]),
    ],
)
def test_a_lowercase_letter_before_a_full_stop_ends_the_sentence(text, max_words, expected):
    assert split_segments(text, max_words) == expected


def test_the_plan_says_code_drawings_and_dense_math_as_text_asks():
    dense = " + ".join(f"x_{i}^{i}" for i in range(2, 30))
    record = {
        "conversations": [
            {"from": "human", "value": "Run this:\n```\nls\n```\nThen look."},
            {"from": "gpt", "value": f"See [asy]draw(A--B);[/asy] and note \\[{dense} = \\boxed{{5}}\\]"},
        ]
    }
    default, _ = plan_conversation("c", record, load_config(None))
    said = " ".join(s["text"] for s in default)
    assert "Run this, as shown in the code." in said and "as shown in the figure" in said
    assert "a long expression, and the answer is 5" in said
    overrides = [
        "text.code_phrase=see the listing",
        "text.figure_phrase=see the drawing",
        "text.dense_math_phrase=a sum",
    ]
    chosen, _ = plan_conversation("c", record, load_config(None, overrides))
    said = " ".join(s["text"] for s in chosen)
    assert "Run this, see the listing." in said and "see the drawing" in said and "a sum, and the answer is 5" in said
    roomy, _ = plan_conversation("c", record, load_config(None, ["text.dense_math_words=500"]))
    assert "x sub 29 to the power of 29 equals 5" in " ".join(s["text"] for s in roomy)


@pytest.mark.parametrize(
    "override, message",
    [
        ("text.code_phrase=<code>", "text.code_phrase must be"),
        ("text.figure_phrase=figure 2", "text.figure_phrase must be"),
        ("text.dense_math_phrase=" + " ".join(["word"] * 9), "text.dense_math_phrase must be"),
        ("text.dense_math_words=2", "text.dense_math_words must be at least 5"),
    ],
)
def test_phrase_settings_are_checked_up_front(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    "text",
    [
        "\\[" * 50_000,  # display math that never closes: each opener must not search the rest again
        "$a " * 33_000,
        "$$" * 50_000,
        "\\[" + "\\begin{a}" * 10_000 + "\\]",
        "<<" * 50_000,
        "1-" * 50_000,
        "[asy]" * 20_000,
    ],
)
def test_pathological_math_is_fast(text):
    start = time.perf_counter()
    clean(text)
    assert time.perf_counter() - start < 2.0
