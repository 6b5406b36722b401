"""Upstream's draws recorded and replayed in the batched engine, for check-model and the tests.

Recorder wraps upstream's model for a reference run: each step of its LLM, the distribution it drew
from, the random state and the token. ForcedDraws stands in for the engine's sampler on the same
texts: each step is scored against upstream's, then takes upstream's token, so the engine decodes
upstream's tokens whatever its precision and its audio can be compared sample for sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Chunk:
    """What upstream's LLM did for one text chunk, step by step: enough to replay its draws elsewhere."""

    drawn: list[int] = field(default_factory=list)  # the token kept at each step (the stop token last)
    logp: list[np.ndarray] = field(default_factory=list)  # the distribution it drew from at each step
    states: list[object] = field(default_factory=list)  # the CPU generator's state before each step's draw
    end_state: object = None  # after the last draw: where the flow's and vocoder's noise begin
    flow_tokens: list[int] = field(default_factory=list)


@dataclass
class Spoken:
    """One run's audio by text index; upstream's run keeps its chunks' draws, the engine's its flow tokens."""

    audio: dict[int, np.ndarray] = field(default_factory=dict)
    chunks: dict[int, list[Chunk]] = field(default_factory=dict)
    tokens: dict[int, list[list[int]]] = field(default_factory=dict)
    endless: set[int] = field(default_factory=set)  # utterances the engine held back as runaway decodes
    sample_rate: int = 0


class Recorder:
    """Wraps upstream's model for the reference run: records each step's distribution, random state
    and token, and draws every random number where the engine draws it.

    The engine's exact sampler and v1's flow noise use the utterance's CPU generator, its vocoder
    noise the GPU's generator seeded by the utterance's seed. On a CPU that is upstream's own order;
    on a GPU upstream would draw all three from the GPU's generator in turn, so here its sampling
    rule gets the scores on the CPU, its flow's randn_like draws on the CPU, and the GPU's generator
    is seeded again before each vocoder call.
    """

    def __init__(self, inner):
        self.inner, self.seed, self.chunks, self.current = inner, 0, [], Chunk()
        self.cuda = torch.device(inner.device).type == "cuda"
        self.saved = {"sampling": inner.llm.sampling, "token2wav": inner.token2wav, "hift": inner.hift.inference}
        self.saved["flow"] = inner.flow.decoder.forward

    def __enter__(self):
        inner, saved = self.inner, self.saved
        inner.llm.sampling = self._sampling(saved["sampling"])
        inner.token2wav = self._token2wav(saved["token2wav"])
        if self.cuda:
            inner.hift.inference = self._seeded(saved["hift"])
            inner.flow.decoder.forward = self._cpu_noise(saved["flow"])
        return self

    def __exit__(self, *exc):
        inner, saved = self.inner, self.saved
        inner.llm.sampling, inner.token2wav, inner.hift.inference = saved["sampling"], saved["token2wav"], saved["hift"]
        inner.flow.decoder.forward = saved["flow"]

    def utterance(self, seed: int) -> list[Chunk]:
        """Start an utterance of `seed`: the chunks it records go in the list returned."""
        self.seed, self.chunks, self.current = seed, [], Chunk()
        return self.chunks

    def _sampling(self, rule):
        def draw(weighted_scores, decoded_tokens, sampling):
            step, chunk = len(decoded_tokens), self.current
            if step == len(chunk.drawn):  # the first call of a step (upstream calls again to skip an early stop)
                chunk.logp.append(weighted_scores.detach().float().cpu().numpy().reshape(-1).copy())
                chunk.states.append(torch.get_rng_state())
                chunk.drawn.append(-1)
            token = rule(weighted_scores.cpu(), decoded_tokens, sampling)
            chunk.drawn[step] = int(token)
            return token.to(weighted_scores.device) if isinstance(token, torch.Tensor) else token

        return draw

    def _token2wav(self, token2wav):
        def recorded(**kwargs):
            chunk, self.current = self.current, Chunk()
            chunk.end_state, chunk.flow_tokens = torch.get_rng_state(), kwargs["token"].reshape(-1).tolist()
            self.chunks.append(chunk)
            return token2wav(**kwargs)

        return recorded

    def _seeded(self, inference):
        def seeded(*args, **kwargs):
            torch.cuda.manual_seed(self.seed)
            return inference(*args, **kwargs)

        return seeded

    @staticmethod
    def _cpu_noise(forward):
        def on_the_cpu(*args, **kwargs):
            randn_like = torch.randn_like
            torch.randn_like = lambda t, **kw: randn_like(t, **{**kw, "device": "cpu"}).to(t.device)
            try:
                return forward(*args, **kwargs)
            finally:
                torch.randn_like = randn_like

        return on_the_cpu


@dataclass
class Draws:
    """How the engine's LLM and sampler fared on upstream's histories, over all the steps of a run."""

    steps: int = 0
    agree: int = 0  # steps where the engine's own draw was upstream's token
    max_tv: float = 0.0  # the largest total variation distance between the two distributions of a step
    sum_tv: float = 0.0
    unmatched: int = 0  # chunks upstream did not decode (the engine split the text otherwise)

    def figures(self) -> dict:
        return {
            "steps": self.steps,
            "agree": self.agree,
            "max_tv": self.max_tv,
            "mean_tv": self.sum_tv / self.steps if self.steps else 0.0,
            "unmatched_chunks": self.unmatched,
        }


class ForcedDraws:
    """Stands in for the engine's sampler: each row draws with the engine's own sampler from
    upstream's random state at that step, is scored against upstream's draw and distribution, and
    then takes upstream's token. Every chunk so decodes upstream's tokens whatever the precision
    (its audio can be compared sample for sample), and one near tie flips one draw, not the rest.
    """

    def __init__(self, sampler, reference: Spoken):
        self.sampler, self.reference, self.draws = sampler, reference, Draws()
        self.options = None  # no GPU sampling: rows draw here

    def draw(self, scores: torch.Tensor, rows: list) -> list:
        chunks = [self._chunk(row) for row in rows]
        for row, chunk in zip(rows, chunks):
            if chunk is not None and len(row.tokens) < len(chunk.states):
                row.stream.generator.set_state(chunk.states[len(row.tokens)])
        own = self.sampler.draw(scores, rows)
        return [self._force(row, chunk, scores[i], own[i]) for i, (row, chunk) in enumerate(zip(rows, chunks))]

    def _chunk(self, row) -> Chunk | None:
        chunks = self.reference.chunks.get(row.request.key, [])
        return chunks[row.index] if row.index < len(chunks) else None

    def _force(self, row, chunk: Chunk | None, scores: torch.Tensor, own):
        step = len(row.tokens)
        if chunk is None or step >= len(chunk.drawn):
            self.draws.unmatched += chunk is None and step == 0
            return own
        token, d = chunk.drawn[step], self.draws
        d.steps, d.agree = d.steps + 1, d.agree + (own == token)
        tv = total_variation(scores, chunk.logp[step])
        d.max_tv, d.sum_tv = max(d.max_tv, tv), d.sum_tv + tv
        if step == len(chunk.drawn) - 1:
            row.stream.generator.set_state(chunk.end_state)
        return token


def total_variation(scores: torch.Tensor, reference: np.ndarray) -> float:
    """Half the L1 distance of the two distributions over the tokens both allow (the engine masks the
    stop tokens before a chunk's least length, where upstream draws again instead)."""
    got, want = scores.double(), torch.from_numpy(reference).double()
    allowed = torch.isfinite(got) & torch.isfinite(want)
    return 0.5 * float((got[allowed].softmax(0) - want[allowed].softmax(0)).abs().sum())
