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
            g = row.stream.generator
            token = int(index[i, torch.multinomial(values[i, : kept[i]], 1, replacement=True, generator=g)])
            recent = row.tokens[-self.options["win_size"] :]
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


# -- on the device -------------------------------------------------------------------------------
MASK32 = 0xFFFFFFFF


def _mul32(x, c: int):
    """(x * c) mod 2**32 for x in [0, 2**32), without passing 2**63 (int64 tensors or Python ints)."""
    return (((x & 0xFFFF) * c) + (((x >> 16) * (c & 0xFFFF)) << 16)) & MASK32


def mix32(x):
    """A 32-bit integer hash (Wellons' lowbias32): every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_key(seed: int, chunk: int) -> int:
    """A chunk's random stream on the device, from its utterance's seed and its place in the utterance."""
    seed &= (1 << 64) - 1
    return mix32((mix32(seed & MASK32) + mix32((seed >> 32) & MASK32) * 3 + 0x9E3779B9 * (chunk + 1)) & MASK32)


def uniform(keys: torch.Tensor, counters: torch.Tensor, lane: int) -> torch.Tensor:
    """A float in [0, 1) per row that depends only on its key, its draw counter and the lane (2**-24 steps)."""
    x = mix32(keys ^ mix32((counters * 2 + lane) & MASK32))
    x = mix32(x ^ ((counters >> 31) + 0x5BD1E995))
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))


class GpuSampler:
    """The ras_sampling rule on the GPU for every row of a step, inside the step's CUDA graph.

    Same rule as Sampler (nucleus within top_p and top_k over the stable descending order; a
    token seen in the last win_size draws is re-drawn from the whole distribution), drawn by
    inverse transform from a counter-based stream per row: the k-th draw of a chunk is a hash of
    (utterance seed, chunk, k), so it never depends on the rows sharing the step. Not the CPU
    generator's numbers: the tokens differ from the exact path, their distribution does not
    (tests/test_cosyvoice_sampler.py measures it). The state lives per row on the device.
    """

    def __init__(self, sampler: Sampler, vocab: int, stops: list[int], rows: int, device):
        options = sampler.options
        self.top_p, self.top_k = float(options["top_p"]), min(int(options["top_k"]), vocab)
        self.window, self.repeats = int(options["win_size"]), options["win_size"] * options["tau_r"]
        self.masks_repeat = sampler.masks_repeat
        self.stop = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.stop[[s for s in stops if s < vocab]] = True
        self.keys = torch.zeros(rows, dtype=torch.long, device=device)
        self.drawn = torch.zeros(rows, dtype=torch.long, device=device)  # tokens drawn so far per row
        self.min_len = torch.zeros(rows, dtype=torch.long, device=device)
        self.history = torch.full((rows, self.window), -1, dtype=torch.long, device=device)
        self.io = torch.zeros(2, rows, dtype=torch.long, device=device)  # a step's tokens in and out

    def state(self) -> list[torch.Tensor]:
        return [self.drawn, self.history, self.io]

    def start(self, row: int, seq, logp: torch.Tensor, tokens: torch.Tensor) -> None:
        """A new row's state, and its first token (drawn from the prefill's log-probabilities) into tokens[row]."""
        self.keys[row] = stream_key(seq.request.seed, seq.index)
        self.drawn[row] = 0
        self.min_len[row] = seq.min_len
        self.history[row] = -1
        part = slice(row, row + 1)
        tokens[part] = self._draw(logp, part)

    def step(self, logp: torch.Tensor, rows: int, tokens: torch.Tensor) -> None:
        """Draw for the first `rows` rows: io[0] gets the tokens they were fed, io[1] and tokens the new ones."""
        self.io[0, :rows].copy_(tokens[:rows])
        drawn = self._draw(logp, slice(0, rows))
        tokens[:rows] = drawn
        self.io[1, :rows] = drawn

    def _draw(self, logp: torch.Tensor, part: slice) -> torch.Tensor:
        keys, drawn, history = self.keys[part], self.drawn[part], self.history[part]
        ban = (drawn < self.min_len[part]) | (drawn == 0)  # upstream's ignore_eos; never an empty utterance
        scores = logp.float().masked_fill(ban[:, None] & self.stop, -float("inf"))
        probs = scores.softmax(dim=-1)
        values, order = stable_top_k(probs, self.top_k)
        kept = values * ((values.cumsum(dim=-1) - values) < self.top_p)  # the nucleus: mass before it under top_p
        first = order.gather(1, pick(kept, uniform(keys, drawn, 0))[:, None]).squeeze(1)
        again = probs.scatter(1, first[:, None], 0.0) if self.masks_repeat else probs
        second = pick(again, uniform(keys, drawn, 1))
        token = torch.where((history == first[:, None]).sum(dim=1) >= self.repeats, second, first)
        history.scatter_(1, (drawn % self.window)[:, None], token[:, None])
        drawn += 1
        return token


INDEX_BITS = 20  # vocabularies up to a million tokens


def stable_top_k(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of each row's stable descending order (equal values: lower index first), without a sort.

    A full sort is what upstream does, but CUDA graphs cannot always capture a segmented sort.
    topk over keys that are unique per row (a probability's bits, then the index reversed) has
    one answer whatever algorithm or batch size topk picks: ties broken as the stable sort does.
    """
    bits = probs.float().view(torch.int32).to(torch.long)  # non-negative floats: their bits order as they do
    index = torch.arange(probs.shape[-1], device=probs.device)
    keys = (bits << INDEX_BITS) | ((1 << INDEX_BITS) - 1 - index)
    order = (1 << INDEX_BITS) - 1 - (keys.topk(k, dim=-1).values & ((1 << INDEX_BITS) - 1))
    return probs.gather(-1, order), order


def pick(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the index whose share of the cumulative weights holds u (inverse transform sampling).

    Rounding can put u * total at the very end: the pick then falls back to the heaviest index,
    so that a zero weight (a banned or left-out token) is never drawn.
    """
    total = weights.cumsum(dim=-1)
    index = (
        torch.searchsorted(total, (u * total[:, -1])[:, None], right=True).squeeze(1).clamp_(max=weights.shape[1] - 1)
    )
    chosen = weights.gather(1, index[:, None]).squeeze(1)
    return torch.where(chosen > 0, index, weights.argmax(dim=-1))
