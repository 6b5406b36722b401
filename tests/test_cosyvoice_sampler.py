"""The GPU sampler against upstream's ras_sampling: same distribution, each row's draws its own whatever the batch
(CPU).

Tolerance: the GPU sampler does not draw the CPU generator's numbers, so its tokens differ from
the exact path's; what must hold is that each draw follows upstream's rule (nucleus within top_p
and top_k, a repeated token re-drawn from the whole distribution), tested here by drawing
12,000 times from both and comparing the frequencies (five standard deviations), and that a
row's k-th draw depends only on its seed, its chunk and k.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch

from convtts.speak.cosyvoice.engine.sampler import GpuSampler, Sampler, stream_key, uniform

VOCAB = 40
DRAWS = 12_000


def rule():
    from cosyvoice.utils.common import ras_sampling

    return SimpleNamespace(sampling=functools.partial(ras_sampling, top_p=0.8, top_k=25, win_size=10, tau_r=0.1))


def scores() -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)) * 1.5


def gpu_sampler(rows: int, stops=()) -> GpuSampler:
    return GpuSampler(Sampler(rule()), VOCAB, list(stops), rows, torch.device("cpu"))


def frequencies(tokens) -> torch.Tensor:
    return torch.bincount(torch.as_tensor(tokens), minlength=VOCAB).double() / len(tokens)


@pytest.mark.parametrize("history", [[], "top"], ids=["no-repeats", "repeats"])
def test_gpu_draws_follow_upstreams_rule(history):
    logits = scores()
    if history == "top":  # the three likeliest tokens were drawn lately: drawing one of them re-draws
        history = logits.topk(3).indices.tolist() + [VOCAB - 1] * 2
    torch.manual_seed(0)
    upstream = [int(rule().sampling(logits.clone(), history, 25)) for _ in range(DRAWS)]
    sampler = gpu_sampler(DRAWS)
    sampler.keys.copy_(torch.tensor([stream_key(seed, 0) for seed in range(DRAWS)]))
    sampler.drawn.fill_(7)
    sampler.history[:, : len(history)] = torch.tensor(history or [-1], dtype=torch.long)
    ours = sampler._draw(logits.log_softmax(dim=0).expand(DRAWS, -1), slice(0, DRAWS)).tolist()
    a, b = frequencies(upstream), frequencies(ours)
    p = (a + b) / 2
    bound = 5 * torch.sqrt(2 * p * (1 - p) / DRAWS) + 2 / DRAWS
    assert bool(((a - b).abs() <= bound).all()), [
        (i, float(a[i]), float(b[i])) for i in range(VOCAB) if abs(a[i] - b[i]) > bound[i]
    ]
    assert sum(t in history for t in ours) > 0 if history else True


def test_a_rows_draws_do_not_depend_on_the_batch():
    torch.manual_seed(1)
    rows = 8
    sampler = gpu_sampler(rows, stops=[0])
    sampler.keys.copy_(torch.tensor([stream_key(1000 + i, i % 3) for i in range(rows)]))
    sampler.drawn.copy_(torch.arange(rows) * 5)
    sampler.history.copy_(torch.randint(0, VOCAB, (rows, sampler.window)))
    logp = torch.randn(rows, VOCAB).log_softmax(dim=-1)
    saved = [t.clone() for t in (sampler.drawn, sampler.history)]
    together = sampler._draw(logp, slice(0, rows)).tolist()
    after = [t.clone() for t in (sampler.drawn, sampler.history)]
    for tensor, before in zip((sampler.drawn, sampler.history), saved):
        tensor.copy_(before)
    alone = [int(sampler._draw(logp[i : i + 1], slice(i, i + 1))) for i in range(rows)]
    assert together == alone
    assert all(torch.equal(a, b) for a, b in zip(after, (sampler.drawn, sampler.history)))
    assert sampler.drawn.tolist() == [n * 5 + 1 for n in range(rows)]


def test_stop_tokens_wait_for_the_minimum_length():
    rows = 2000
    sampler = gpu_sampler(rows, stops=[3])
    logp = torch.full((rows, VOCAB), -20.0)
    logp[:, 3] = 0.0  # the stop token holds nearly all the mass
    sampler.keys.copy_(torch.tensor([stream_key(s, 0) for s in range(rows)]))
    sampler.min_len.fill_(5)
    sampler.drawn.copy_(torch.tensor([4, 5] * (rows // 2)))
    tokens = sampler._draw(logp, slice(0, rows))
    assert not bool((tokens[0::2] == 3).any())  # 4 drawn, minimum 5: never the stop token
    assert bool((tokens[1::2] == 3).all())
    sampler.drawn.zero_()
    sampler.min_len.zero_()
    assert not bool((sampler._draw(logp, slice(0, rows)) == 3).any())  # a first draw never ends the utterance


def test_streams_are_counters():
    keys = torch.tensor([stream_key(7, 0), stream_key(7, 1), stream_key(8, 0)] * 2)
    counters = torch.tensor([0, 0, 0, 1, 1, 1])
    u = uniform(keys, counters, 0)
    assert torch.equal(u, uniform(keys, counters, 0))
    assert len(set(u.tolist())) == 6 and not torch.equal(u, uniform(keys, counters, 1))
    many = uniform(torch.full((100_000,), stream_key(3, 0)), torch.arange(100_000), 0)
    counts = torch.histc(many, bins=10, min=0, max=1)
    assert float(many.min()) >= 0 and float(many.max()) < 1
    assert float(((counts - 10_000) ** 2 / 10_000).sum()) < 40  # chi-square, 9 degrees of freedom: p < 1e-5
    assert abs(float(many.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / 100_000)


def test_the_top_k_is_the_stable_sorts():
    from convtts.speak.cosyvoice.engine.sampler import stable_top_k

    probs = torch.tensor([[0.1, 0.3, 0.1, 0.3, 0.0, 0.2], [0.0, 0.0, 0.5, 0.0, 0.5, 0.0]])
    values, order = stable_top_k(probs, 4)
    full_values, full_order = probs.sort(dim=-1, descending=True, stable=True)
    assert torch.equal(order, full_order[:, :4]) and torch.equal(values, full_values[:, :4])
    assert order.tolist() == [[1, 3, 5, 0], [2, 4, 0, 1]]
    many = torch.rand(64, 4097).softmax(dim=-1)
    many[:, 100:140] = many[:, 99:100]  # ties across the k-th place
    assert torch.equal(stable_top_k(many, 25)[1], many.sort(dim=-1, descending=True, stable=True)[1][:, :25])
