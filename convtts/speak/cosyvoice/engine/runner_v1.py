"""v1's LLM (TransformerLM): its prompt, upstream's decode over a padded cache, and our decode step over a static cache.

The decoder is a cosyvoice TransformerEncoder: pre-norm layers of relative-position self-attention
(Transformer-XL's, ESPnet's newer encoding) and a ReLU feed-forward, after a linear embedding
(Linear, LayerNorm, ReLU, times sqrt(width)). For one new token at position n attending over
positions 0..n, upstream's rel_shift reduces to: key j scores
    ((q + u) . k_j + (q + v) . p_{n-j}) / sqrt(head size)
where p_t is linear_pos of the encoding of relative position t. Our step precomputes p_t per
layer for every t the cache can hold and gathers each row's scores by its own length, so rows of
different lengths share one step without padding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.runner import StaticRunner, UpstreamRunner


def v1_prompt(llm, chunk: dict, sos: int, device, dtype) -> torch.Tensor:
    """[sos, speaker, text, task id, prompt speech] embeddings, as TransformerLM.inference builds them."""
    text = chunk["text"].to(device)
    prompt_text = chunk.get("prompt_text", torch.zeros(1, 0, dtype=torch.int32)).to(device)
    text = torch.concat([prompt_text, text], dim=1)
    text_len = torch.full(
        (1,), text.shape[1], dtype=torch.int32, device=device
    )  # a fill: no copy that waits for the GPU
    text, _ = llm.encode(llm.text_embedding(text), text_len)
    embedding = chunk.get("llm_embedding", torch.zeros(0, 192)).to(device)
    if embedding.shape[0] != 0:
        embedding = llm.spk_embed_affine_layer(F.normalize(embedding, dim=1).to(dtype)).unsqueeze(dim=1)
    else:
        embedding = torch.zeros(1, 0, llm.llm_input_size, dtype=text.dtype, device=device)
    start = llm.llm_embedding.weight[sos].reshape(1, 1, -1)
    task = llm.llm_embedding.weight[llm.task_id].reshape(1, 1, -1)
    prompt_speech = chunk.get("llm_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32)).to(device)
    prompt_emb = (
        llm.speech_embedding(prompt_speech)
        if prompt_speech.shape[1]
        else torch.zeros(1, 0, llm.llm_input_size, dtype=text.dtype, device=device)
    )
    return torch.concat([start, embedding, text, task, prompt_emb], dim=1)


def v1_prefill(llm, lm_input: torch.Tensor):
    """Upstream's first decode step: the prompt through forward_chunk; (log-probabilities, cache [layers, heads,
    time, 2 x dim])."""
    size = lm_input.shape[1]
    device = lm_input.device
    mask = torch.tril(torch.ones((1, size, size), device=device)).to(torch.bool)
    empty = torch.zeros((0, 0, 0, 0), device=device)
    out, cache, _ = llm.llm.forward_chunk(
        lm_input, offset=0, required_cache_size=-1, att_cache=empty, cnn_cache=empty, att_mask=mask
    )
    return out[:, -1], cache


def sos_of(llm) -> int:
    return getattr(llm, "sos", getattr(llm, "sos_eos", 0))


class UpstreamTransformerRunner(UpstreamRunner):
    """v1 decode steps through upstream's encoder layers, all live rows at once over the padded cache."""

    def prompt(self, seq):
        hidden, cache = v1_prefill(self.llm, v1_prompt(self.llm, seq.chunk, sos_of(self.llm), self.device, self.dtype))
        return self.logp(hidden), [cache[i : i + 1] for i in range(cache.shape[0])]

    def forward(self, seqs) -> torch.Tensor:
        encoder = self.llm.llm
        tokens = torch.tensor([seq.tokens[-1] for seq in seqs], device=self.device)
        xs = self.llm.speech_embedding.weight[tokens].unsqueeze(1)
        layers = self.cache.layers
        length = layers[0].shape[2]
        xs, _, _ = encoder.embed(xs, torch.ones(len(seqs), 1, 1, dtype=torch.bool, device=self.device), length)
        pos_emb = encoder.embed.position_encoding(offset=0, size=length + 1)
        pads = torch.tensor([seq.pad for seq in seqs], device=self.device)
        mask = (torch.arange(length + 1, device=self.device)[None, :] >= pads[:, None]).unsqueeze(1)
        empty = torch.zeros((0, 0, 0, 0), device=self.device)
        for i, layer in enumerate(encoder.encoders):
            xs, _, layers[i], _ = layer(xs, mask, pos_emb, att_cache=layers[i], cnn_cache=empty)
        if encoder.normalize_before:
            xs = encoder.after_norm(xs)
        for seq in seqs:
            seq.launched += 1
        return self.logp(xs[:, -1])


def supports_static(llm) -> bool:
    """Our step reproduces pre-norm layers of relative-position attention after a linear_legacy embedding."""
    encoder = getattr(llm, "llm", None)
    layers = getattr(encoder, "encoders", None)
    return (
        layers is not None
        and len(layers) > 0
        and getattr(encoder, "normalize_before", False)
        and type(encoder.embed).__name__ == "LegacyLinearNoSubsampling"
        and type(encoder.embed.pos_enc).__name__ == "EspnetRelPositionalEncoding"
        and all(
            type(layer.self_attn).__name__ == "RelPositionMultiHeadedAttention" and layer.normalize_before
            for layer in layers
        )
    )


class TransformerRunner(StaticRunner):
    """v1 decode steps of our own over the static cache, from the encoder's own weights."""

    def __init__(self, llm, device, precision, options):
        encoder = llm.llm
        attention = encoder.encoders[0].self_attn
        vocab = llm.llm_decoder.out_features
        super().__init__(llm, device, precision, options, len(encoder.encoders), attention.h, attention.d_k, vocab)
        self.encoder = encoder
        self.qkv = [fused_qkv(layer.self_attn) for layer in encoder.encoders]
        self.rel: list[torch.Tensor] = []

    def prompt(self, seq):
        hidden, cache = v1_prefill(self.llm, v1_prompt(self.llm, seq.chunk, sos_of(self.llm), self.device, self.dtype))
        dim = cache.shape[-1] // 2
        return (
            self.logp(hidden),
            [cache[i : i + 1, :, :, :dim] for i in range(cache.shape[0])],
            [cache[i : i + 1, :, :, dim:] for i in range(cache.shape[0])],
        )

    def tables(self, capacity: int) -> None:
        """Per layer, linear_pos of relative positions 0..capacity-1, as [heads, head size, positions]."""
        encoding = relative_encoding(self.encoder.embed.pos_enc, capacity).to(device=self.device, dtype=self.dtype)
        _, heads, dim = self.shape
        self.rel = [
            layer.self_attn.linear_pos(encoding).view(capacity, heads, dim).permute(1, 2, 0).contiguous()
            for layer in self.encoder.encoders
        ]
        self.positions = torch.arange(capacity, device=self.device)

    def forward(self, rows: int, length: int) -> torch.Tensor:
        lengths = self.cache.lengths[:rows]  # the new token's position in each slot
        x = self.llm.speech_embedding.weight[self.cache.tokens[:rows]]
        x = self.encoder.embed.out(x) * self.encoder.embed.pos_enc.xscale
        keys = self.positions[:length]
        beyond = keys[None, :] > lengths[:, None]  # [rows, length]: positions past each row's own
        distance = (lengths[:, None] - keys[None, :]).clamp(0, length - 1)
        for i, layer in enumerate(self.encoder.encoders):
            x = x + self.attend(i, layer.self_attn, layer.norm1(x), lengths, beyond, distance, length)
            x = x + layer.feed_forward(layer.norm2(x))
        return self.encoder.after_norm(x)

    def attend(self, i: int, attention, x, lengths, beyond, distance, length: int) -> torch.Tensor:
        rows = x.shape[0]
        _, heads, dim = self.shape
        q, k, v = F.linear(x, *self.qkv[i]).view(rows, 3, heads, dim).unbind(1)
        self.cache.write(i, rows, lengths, k, v)
        keys, values = self.cache.k[i, :rows, :, :length], self.cache.v[i, :rows, :, :length]
        content = torch.matmul((q + attention.pos_bias_u).unsqueeze(2), keys.transpose(-1, -2)).squeeze(2)
        position = torch.matmul((q + attention.pos_bias_v).transpose(0, 1), self.rel[i][:, :, :length]).transpose(0, 1)
        position = position.gather(2, distance.unsqueeze(1).expand(rows, heads, length))
        scores = ((content + position) / math.sqrt(dim)).masked_fill(beyond.unsqueeze(1), -float("inf"))
        context = torch.matmul(torch.softmax(scores, dim=-1).unsqueeze(2), values).reshape(rows, heads * dim)
        return attention.linear_out(context)


def fused_qkv(attention) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention's query, key and value projections as one weight and bias (one matrix product)."""
    linears = (attention.linear_q, attention.linear_k, attention.linear_v)
    weight = torch.cat([linear.weight for linear in linears])
    bias = torch.cat(
        [linear.bias if linear.bias is not None else torch.zeros_like(linear.weight[:, 0]) for linear in linears]
    )
    return weight, bias


def relative_encoding(pos_enc, positions: int) -> torch.Tensor:
    """ESPnet's encoding of relative positions 0..positions-1 ([positions, width]), from the module's own table.

    Its table holds positive positions reversed, then negative ones; position 0 sits at the centre.
    """
    if pos_enc.pe.size(1) < 2 * positions - 1:
        pos_enc.extend_pe(torch.zeros(1, positions, dtype=pos_enc.pe.dtype, device=pos_enc.pe.device))
    pe = pos_enc.pe[0]
    centre = pe.size(0) // 2
    return pe[centre - positions + 1 : centre + 1].flip(0)
