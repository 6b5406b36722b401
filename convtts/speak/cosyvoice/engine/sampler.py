"""The LLM's sampling rule for every live row of a decode step, each row on its own random stream."""
from __future__ import annotations

import inspect

import torch

from convtts.speak.cosyvoice.engine.requests import own_random_stream

SAMPLING_K = 25  # upstream's default `sampling` argument of TransformerLM.inference


class Sampler:
    """The model's sampling rule for all rows of a step, each row drawing from its own generator.

    CosyVoice's yaml names ras_sampling (nucleus sampling within top_p and top_k; a token seen in
    the last win_size draws is re-drawn from the whole distribution). For that rule this does the
    sort and the cumulative sums for all rows at once and draws exactly as the installed upstream
    does (one multinomial on the kept probabilities, then one on the full distribution if needed,
    without the repeated token in newer releases); any other
    rule is called as upstream calls it, row by row.
    """

    def __init__(self, llm):
        rule = llm.sampling
        self.llm = llm
        self.options = None
        if getattr(getattr(rule, "func", None), "__name__", "") == "ras_sampling":
            defaults = {k: v.default for k, v in inspect.signature(rule.func).parameters.items()}
            self.options = {k: rule.keywords.get(k, defaults[k]) for k in ("top_p", "top_k", "win_size", "tau_r")}
            self.masks_repeat = self._masks_repeat(rule)

    @staticmethod
    def _masks_repeat(rule) -> bool:
        """Whether this upstream's re-draw leaves the repeated token out (newer releases) or not.

        Asked of upstream's own function: a distribution with all its mass on token 0, which the
        last draws repeat, is re-drawn; only a rule that masks token 0 can return another token.
        """
        scores = torch.full((8,), -1e4)
        scores[0] = 0.0
        with torch.random.fork_rng(devices=[]):
            return int(rule(scores, [0] * 20, SAMPLING_K)) != 0

    def draw(self, scores: torch.Tensor, rows: list) -> list:
        if self.options is None:
            return [self._upstream(scores[i], row) for i, row in enumerate(rows)]
        top_p, top_k = self.options["top_p"], self.options["top_k"]
        probs = scores.softmax(dim=-1)
        values, index = stable_top(probs, min(top_k, probs.shape[-1]))
        before = torch.cat([torch.zeros_like(values[:, :1]), values.cumsum(dim=-1)[:, :-1]], dim=-1)
        kept = (before < top_p).sum(dim=-1).tolist()
        tokens = []
        for i, row in enumerate(rows):
            g = row.request.generator
            token = int(index[i, torch.multinomial(values[i, :kept[i]], 1, replacement=True, generator=g)])
            recent = row.tokens[-self.options["win_size"]:]
            if recent.count(token) >= self.options["win_size"] * self.options["tau_r"]:
                again = scores[i].clone()
                if self.masks_repeat:
                    again[token] = -float("inf")
                token = int(torch.multinomial(again.softmax(dim=0), 1, replacement=True, generator=g))
            tokens.append(token)
        return tokens

    def _upstream(self, scores: torch.Tensor, row):
        try:
            with own_random_stream(row.request):
                return int(self.llm.sampling(scores.clone(), row.tokens, SAMPLING_K))
        except Exception as exc:
            return exc


def stable_top(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of each row's stable descending sort (equal values: lower index first), fast.

    Upstream sorts the whole distribution (stable); a random-weight model has exact ties often
    enough that topk's arbitrary order among them changes draws. topk finds the set, a stable sort
    of those k orders it, and a row with a tie across the k-th place is sorted in full.
    """
    values, index = probs.topk(k, dim=-1)
    index, by_index = index.sort(dim=-1)
    values, order = values.gather(-1, by_index).sort(dim=-1, descending=True, stable=True)
    index = index.gather(-1, order)
    crowded = ((probs >= values[:, -1:]).sum(dim=-1) > k).nonzero().flatten().tolist()
    for row in crowded:
        full_values, full_index = probs[row].sort(descending=True, stable=True)
        values[row], index[row] = full_values[:k], full_index[:k]
    return values, index
