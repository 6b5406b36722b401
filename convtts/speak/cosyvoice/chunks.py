"""Text chunks within the text tokens a decode row was sized for.

The static KV cache gives every row the positions of the longest chunk text.max_words allows
(sizes.row_tokens: 2 text tokens a word, and up to 20 speech tokens a text token). Real text can
hold far more tokens a word: OCR-token lists ("Reference OCR token: CALORIECOLA, ZERO, oZ(222mL),
...") reach 4.7 a word, 141 tokens for 30 words where 68 were planned. A chunk like that grows
every row's cache by a third, and eight workers growing at once ran a GPU out of memory. The
runtime's frontend cuts a paragraph at sentence ends only (comma_split off), so such a list stays
one chunk; here a chunk over the budget is cut at word boundaries, after a comma where one is
near, into pieces of about equal tokens, each spoken in turn as any multi-chunk text is.
"""

from __future__ import annotations

import math
from collections.abc import Callable

MID_SENTENCE = 0.25  # a cut between words with no comma costs as much as a piece this share off its size


def within_budget(parts: list[str], count: Callable[[str], int], budget: int) -> list[str]:
    """`parts` with each one over `budget` tokens (by `count`) cut into pieces of at most about that."""
    if budget <= 0:
        return parts
    return [piece for part in parts for piece in cut(part, count, budget)]


def cut(text: str, count: Callable[[str], int], budget: int) -> list[str]:
    """`text` as the fewest pieces within `budget` tokens, cut between words, of close token counts and
    after a comma where the counts allow; one piece if it fits.

    A word's tokens are counted with its leading space, as the tokeniser's pre-split sees it inside
    the text, so the sum over words is the text's count up to a merge at a boundary. A word longer
    than the budget is a piece of its own (the cache grows for it, as before).
    """
    if count(text) <= budget:
        return [text]
    words = text.split()
    sizes = [count(word if i == 0 else " " + word) for i, word in enumerate(words)]
    for pieces in range(math.ceil(sum(sizes) / budget), len(words) + 1):
        ends = best_cuts(words, sizes, budget, pieces)
        if ends is not None:
            return [" ".join(words[start:end]) for start, end in zip([0] + ends, ends)]
    return [text]  # unreachable: one word a piece always fits


def best_cuts(words: list[str], sizes: list[int], budget: int, pieces: int) -> list[int] | None:
    """Where `pieces` pieces end (word indices, the last is len(words)) at the least cost: each piece's
    squared distance from an even share, plus a price for a cut with no comma; None if none fits."""
    share = sum(sizes) / pieces
    price = (MID_SENTENCE * share) ** 2
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    n = len(words)
    best = {(0, 0): (0.0, None)}  # (pieces made, words used) -> (cost, previous words used)
    for made in range(1, pieces + 1):
        for end in range(made, n + 1):
            options = []
            for start in range(made - 1, end):
                if (made - 1, start) not in best:
                    continue
                size = prefix[end] - prefix[start]
                if size > budget and end - start > 1:
                    continue
                cost = best[(made - 1, start)][0] + (size - share) ** 2
                if end < n and not words[end - 1].endswith((",", ";", ":")):
                    cost += price
                options.append((cost, start))
            if options:
                best[(made, end)] = min(options)
    if (pieces, n) not in best:
        return None
    ends, end = [], n
    for made in range(pieces, 0, -1):
        ends.append(end)
        end = best[(made, end)][1]
    return ends[::-1]
