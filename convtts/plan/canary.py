"""Conversations the planner's text rules are fingerprinted by: what cleaning and splitting make of them.

A plan records the digest of these conversations' segments (freshness.rules_digest). When a change
to the cleaner, the math and operator words or the splitter changes what any of them says, the
digest changes with it, and a plan made by the older rules reads as stale without anyone raising
PLAN_VERSION by hand. Each record exercises one family of rules; add one when a rule has none here.
"""

from __future__ import annotations

CANARY = [
    {
        "id": "markdown",
        "conversations": [
            {"from": "human", "value": "<image>\nWhat is shown here? See https://example.com/a?b=1 for more."},
            {
                "from": "gpt",
                "value": "## Summary\n\n**The image** shows a *red* bicycle.\n\n- It has two wheels;\n"
                "- it costs $1,250.50 (about 20% off).\n\n1. First, check the tyres.\n2. Then ride.",
            },
        ],
    },
    {
        "id": "code",
        "conversations": [
            {"from": "human", "value": "What does `print(sum(range(10)))` do in Python?"},
            {
                "from": "gpt",
                "value": "It adds the numbers 0 to 9:\n\n```python\nprint(sum(range(10)))\n```\n\n"
                "This prints 45. Each value of n is added once.",
            },
        ],
    },
    {
        "id": "math",
        "conversations": [
            {"from": "human", "value": "Simplify $\\frac{2}{3} + \\sqrt{x^2}$ when $x \\le 0$."},
            {
                "from": "gpt",
                "value": "We have \\[\\frac{2}{3} - x\\] so the answer is $\\boxed{\\frac{2}{3}-x}$, "
                "and $\\alpha = 30^\\circ$.\n\n\\begin{align*}\na &= 2 \\times 3 \\\\\nb &= a \\cdot 4\n\\end{align*}",
            },
        ],
    },
    {
        "id": "gsm8k",
        "conversations": [
            {"from": "human", "value": "Tom has 3 boxes of 12 eggs. How many eggs?"},
            {"from": "gpt", "value": "He has 3*12 = <<3*12=36>>36 eggs, and 36/4 = 9 a day.\n#### 36"},
        ],
    },
    {
        "id": "chinese",
        "conversations": [
            {"from": "human", "value": "请解释一下什么是机器学习，并举一个例子。"},
            {
                "from": "gpt",
                "value": "机器学习是人工智能的一个分支，它让计算机从数据中学习规律，而不需要明确编程。"
                "例如，垃圾邮件过滤器通过分析大量已标记的邮件，学会识别新的垃圾邮件；"
                "推荐系统根据你过去的选择，预测你可能喜欢的电影。用Python可以很快写出一个简单的模型，"
                "准确率达到95%。计算$\\frac{1}{2}$的值。",
            },
        ],
    },
    {
        "id": "long",
        "conversations": [
            {
                "from": "gpt",
                "value": " ".join(
                    f"Sentence {n} describes the scene in some detail, with a clause that runs on, and then another."
                    for n in range(1, 9)
                ),
            },
            {"from": "human", "value": "東京の天気はどうですか？明日は雨が降りますか？"},
        ],
    },
]
