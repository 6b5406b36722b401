"""Whisper's greedy decoding over static buffers, one step for every row at once, captured as a CUDA
graph per bucket of rows and length on the GPU (run eagerly on the CPU, the same code), by the
batched CosyVoice engine's StepGraphs (its buckets, warm-up, shared pool and eager fallback).

Measured on one H200, a decoder step of transformers' Whisper costs about 3.6 ms whatever its rows
(bench/results/h200-2026-11-24-gate/): a few dozen small kernels launched one by one from Python, and under MPS
each launch waits behind the other workers'. Replayed from a graph, a step is one launch. The
step does what transformers' decoder does with a cache: the token's embedding plus its position's,
then per layer self-attention over the positions so far, cross-attention over the encoder's frames,
and the feed-forward, each behind its layer norm; then the last norm, the logits, and the greedy
choice with the gate's rules (TransformersWhisper._token_rules), all on the device. The prompt is
fed one token a step, so every step has the same shape.

Buffers are sized once per recogniser, for its largest batch and the model's 448 positions (the
cross-attention keys and values dominate: 30 MiB a window for large-v3-turbo in bf16); a graph runs
on views of them, so graphs for several buckets share one set.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from convtts.cuda_graphs import StepGraphs, length_bucket, row_bucket


class StaticDecoder:
    """Greedy decoding of up to `rows` windows together, over static buffers (see the module's doc)."""

    def __init__(self, model, rows: int, prompt: list[int], end: int, never, first):
        self.model, self.decoder = model, model.model.decoder
        config, weight = model.config, model.proj_out.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.heads = config.decoder_attention_heads
        self.width = config.d_model // self.heads
        self.rows, self.length = rows, config.max_target_positions
        self.prompt, self.end = prompt, end
        self._buffers(config, never, first)
        # the warm-up before a capture is undone on what a step advances; its KV writes are rewritten
        state = [self.token, self.step, self.done, self.said]
        self.graphs = StepGraphs(self._step, self.device, self.device.type == "cuda", False, state)

    def _buffers(self, config, never, first) -> None:
        zeros = self._zeros
        layers, frames = len(self.decoder.layers), config.max_source_positions
        self.self_k = [zeros(self.rows, self.heads, self.length, self.width) for _ in range(layers)]
        self.self_v = [zeros(self.rows, self.heads, self.length, self.width) for _ in range(layers)]
        self.cross_k = [zeros(self.rows, self.heads, frames, self.width) for _ in range(layers)]
        self.cross_v = [zeros(self.rows, self.heads, frames, self.width) for _ in range(layers)]
        long = dict(dtype=torch.long, device=self.device)
        self.token = torch.zeros(self.rows, **long)  # each row's input to the next step
        self.step = torch.zeros((), **long)  # positions fed so far
        self.limit = torch.zeros(self.rows, **long)  # a row's tokens at most, past the prompt
        self.done = torch.zeros(self.rows, dtype=torch.bool, device=self.device)
        self.said = torch.zeros(self.rows, self.length, **long)
        self.positions = torch.arange(self.length, device=self.device)
        self.prompt_ids = torch.tensor(self.prompt + [0], **long)  # + 0: indexed one past the prompt, unused
        vocab = config.vocab_size
        self.never = torch.zeros(vocab, device=self.device)
        self.never[never] = -torch.inf
        self.first = self.never.clone()
        self.first[first] = -torch.inf

    def _zeros(self, *shape):
        return torch.zeros(*shape, dtype=self.dtype, device=self.device)

    def decode(self, encoded, limits: list[int], prompt: list[int] | None = None) -> list[list[int]]:
        """Each row's tokens (end-of-text dropped), greedily, up to its limit or end-of-text. `prompt`:
        another of the same length (another language's token), copied in place: the graphs read it there."""
        if prompt is not None and prompt != self.prompt:
            self.prompt = list(prompt)
            self.prompt_ids[: len(prompt)].copy_(torch.tensor(prompt, device=self.device))
        count = len(limits)
        rows = row_bucket(count, self.rows)
        length = length_bucket(len(self.prompt) + max(limits), self.length)
        self._start(encoded, limits, rows)
        steps = len(self.prompt) - 1 + max(limits)
        for step in range(steps):
            self.graphs.run(rows, length)
            if step % 8 == 7 and step >= len(self.prompt) and bool(self.done[:count].all()):
                break  # each look waits for the GPU; a done row only repeats end-of-text meanwhile
        said = self.said[:count, : max(limits)].tolist()
        return [[t for t in row if t != self.end] for row in said]

    def _start(self, encoded, limits: list[int], rows: int) -> None:
        """The batch's cross-attention keys and values into the buffers; every row at the prompt's start."""
        count = len(limits)
        for layer, keys, values in zip(self.decoder.layers, self.cross_k, self.cross_v):
            attention = layer.encoder_attn
            keys[:count].copy_(self._split(attention.k_proj(encoded)))
            values[:count].copy_(self._split(attention.v_proj(encoded)))
            keys[count:rows].zero_()
            values[count:rows].zero_()
        self.token.fill_(self.prompt[0])
        self.step.zero_()
        self.limit.zero_()
        self.limit[:count] = torch.tensor(limits, device=self.device)
        self.done.zero_()
        self.done[count:] = True  # a padding row says end-of-text throughout
        self.said.fill_(self.end)

    def _split(self, states):
        """(rows, positions, d_model) as (rows, heads, positions, head width)."""
        return states.view(states.shape[0], states.shape[1], self.heads, self.width).transpose(1, 2)

    def _step(self, rows: int, length: int) -> None:
        """Feed each row its token at position `step`; from the prompt's last token on, choose the next."""
        step, decoder = self.step, self.decoder
        position = decoder.embed_positions.weight.index_select(0, step[None])  # no host sync, unlike weight[step]
        hidden = decoder.embed_tokens(self.token[:rows, None]) + position
        seen = (self.positions[:length] <= step)[None, None, None]  # (1, 1, 1, length)
        for number, layer in enumerate(decoder.layers):
            hidden = hidden + self._self_attention(layer, number, hidden, rows, length, seen)
            hidden = hidden + self._cross_attention(layer, number, hidden, rows)
            hidden = hidden + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
        logits = self.model.proj_out(decoder.layer_norm(hidden))[:, 0].float()
        self._choose(logits, rows)

    def _self_attention(self, layer, number: int, hidden, rows: int, length: int, seen):
        attention, normed = layer.self_attn, layer.self_attn_layer_norm(hidden)
        keys, values = self.self_k[number][:rows, :, :length], self.self_v[number][:rows, :, :length]
        keys.index_copy_(2, self.step[None], self._split(attention.k_proj(normed)))
        values.index_copy_(2, self.step[None], self._split(attention.v_proj(normed)))
        mixed = F.scaled_dot_product_attention(self._split(attention.q_proj(normed)), keys, values, attn_mask=seen)
        return attention.out_proj(mixed.transpose(1, 2).reshape(rows, 1, -1))

    def _cross_attention(self, layer, number: int, hidden, rows: int):
        attention = layer.encoder_attn
        query = self._split(attention.q_proj(layer.encoder_attn_layer_norm(hidden)))
        mixed = F.scaled_dot_product_attention(query, self.cross_k[number][:rows], self.cross_v[number][:rows])
        return attention.out_proj(mixed.transpose(1, 2).reshape(rows, 1, -1))

    def _choose(self, logits, rows: int) -> None:
        """The greedy token of a row past its prompt, recorded at its place in `said`; the next input is
        the prompt's next token while the prompt lasts."""
        last = len(self.prompt) - 1
        told = self.step - last  # tokens chosen before this one
        rule = torch.where(told == 0, self.first, self.never)
        token = torch.where(self.done[:rows], self.end, (logits + rule).argmax(-1))
        chose = told >= 0
        place = told.clamp(min=0)[None]
        said = self.said[:rows]
        said.index_copy_(1, place, torch.where(chose, token, said.index_select(1, place)[:, 0])[:, None])
        finished = (token == self.end) | (told + 1 >= self.limit[:rows])
        self.done[:rows] |= chose & finished
        prompt_next = self.prompt_ids.index_select(0, (self.step + 1).clamp(max=last + 1)[None])  # no host sync
        self.token[:rows] = torch.where(self.step < last, prompt_next, token)
        self.step += 1
