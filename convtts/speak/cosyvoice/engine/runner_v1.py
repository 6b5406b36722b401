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
from torch.nn.utils.rnn import pad_sequence

from convtts.speak.cosyvoice.engine.attention import decode_attention
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


def v1_prompt_length(chunk: dict) -> int:
    """The positions of the chunk's v1_prompt, from its tensors' shapes (nothing runs)."""
    parts = [chunk.get(name) for name in ("prompt_text", "text", "llm_prompt_speech_token")]
    speaker = chunk.get("llm_embedding")
    return 2 + sum(part.shape[1] for part in parts if part is not None) + speaker_rows(speaker)


def speaker_rows(embedding) -> int:
    """Positions a chunk's llm_embedding takes in its prompt: one (v1's sft and zero-shot chunks), or none."""
    return 0 if embedding is None else int(embedding.shape[0])


def v1_prompts(llm, chunks: list[dict], sos: int, device, dtype) -> tuple[torch.Tensor, list[int]]:
    """v1_prompt of several chunks, right-padded to the longest ([rows, positions, width]), and each one's length.

    The texts go through the text encoder together: it masks each row's keys by its length, and its
    relative positions depend on query-key distance only, so a row's padding on the right changes
    nothing of it (up to float rounding).
    """
    texts = [torch.concat(text_parts(chunk, device), dim=1)[0] for chunk in chunks]
    lengths = on_device([len(text) for text in texts], torch.int32, device)
    encoded, _ = llm.encode(llm.text_embedding(pad_sequence(texts, batch_first=True)), lengths)
    speakers = speaker_embeddings(llm, chunks, device, dtype, encoded.dtype)
    start = llm.llm_embedding.weight[sos].reshape(1, -1)
    task = llm.llm_embedding.weight[llm.task_id].reshape(1, -1)
    rows = []
    for i, chunk in enumerate(chunks):
        speech = chunk.get("llm_prompt_speech_token")
        parts = [start, speakers[i], encoded[i, : len(texts[i])], task]
        if speech is not None and speech.shape[1]:
            parts.append(llm.speech_embedding(speech.to(device))[0])
        rows.append(torch.concat(parts))
    return pad_sequence(rows, batch_first=True), [len(row) for row in rows]


def text_parts(chunk: dict, device) -> list[torch.Tensor]:
    """The prompt's text, then the chunk's ([1, tokens] each), as v1_prompt joins them."""
    prompt_text = chunk.get("prompt_text", torch.zeros(1, 0, dtype=torch.int32))
    return [prompt_text.to(device), chunk["text"].to(device)]


def speaker_embeddings(llm, chunks: list[dict], device, dtype, out_dtype) -> list[torch.Tensor]:
    """Each chunk's speaker embedding as v1_prompt projects it ([1, width]), or [0, width] for a chunk without;
    the chunks that have one go through the projection together."""
    given = [i for i, chunk in enumerate(chunks) if speaker_rows(chunk.get("llm_embedding"))]
    rows = [torch.zeros(0, llm.llm_input_size, dtype=out_dtype, device=device)] * len(chunks)
    if given:
        stacked = torch.concat([chunks[i]["llm_embedding"].to(device) for i in given])
        projected = llm.spk_embed_affine_layer(F.normalize(stacked, dim=1).to(dtype))
        sizes = [speaker_rows(chunks[i]["llm_embedding"]) for i in given]
        for i, part in zip(given, projected.split(sizes)):
            rows[i] = part
    return rows


def v1_prefill_rows(llm, lm_input: torch.Tensor, lengths: list[int]):
    """v1_prefill of right-padded prompts: each row's last hidden state [rows, width] and the per-layer caches
    [rows, heads, positions, 2 x dim] (a row's positions past its length are padding).

    forward_chunk's own steps at offset 0 without a cache (it asserts one row): embedding, positions,
    the layers under a causal mask that also hides each row's padding, the final norm.
    """
    encoder = llm.llm
    rows, size, _ = lm_input.shape
    device = lm_input.device
    valid = on_device(lengths, torch.long, device)
    causal = torch.tril(torch.ones((size, size), dtype=torch.bool, device=device))
    mask = causal[None] & (torch.arange(size, device=device)[None, None, :] < valid[:, None, None])
    empty = torch.zeros((0, 0, 0, 0), device=device)
    xs = lm_input if getattr(encoder, "global_cmvn", None) is None else encoder.global_cmvn(lm_input)
    xs, _, _ = encoder.embed(xs, torch.ones((rows, 1, size), dtype=torch.bool, device=device), 0)
    pos_emb = encoder.embed.position_encoding(offset=0, size=size)
    caches = []
    for layer in encoder.encoders:
        xs, _, cache, _ = layer(xs, mask, pos_emb, att_cache=empty, cnn_cache=empty)
        caches.append(cache)
    if encoder.normalize_before:
        xs = encoder.after_norm(xs)
    return xs[torch.arange(rows, device=device), valid - 1], caches


def on_device(values: list[int], dtype, device) -> torch.Tensor:
    """A short list of numbers on the device; from pinned memory, so the copy does not wait for the GPU's queue."""
    host = torch.tensor(values, dtype=dtype)
    if torch.device(device).type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


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

    batched = True  # prompts(): chunks admitted together prefill in one forward
    relative = True

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

    def prompt_length(self, seq) -> int:
        return v1_prompt_length(seq.chunk)

    def prompts(self, seqs) -> list[tuple]:
        """prompt() of several chunks in one padded forward (a prefill is mostly launch overhead: one chunk's
        small kernels take as long as many chunks'); per chunk, in order, what prompt() returns for it."""
        chunks = [seq.chunk for seq in seqs]
        lm_input, lengths = v1_prompts(self.llm, chunks, sos_of(self.llm), self.device, self.dtype)
        hidden, caches = v1_prefill_rows(self.llm, lm_input, lengths)
        logp = self.logp(hidden)
        dim = caches[0].shape[-1] // 2
        return [
            (
                logp[i : i + 1],
                [cache[i : i + 1, :, :length, :dim] for cache in caches],
                [cache[i : i + 1, :, :length, dim:] for cache in caches],
            )
            for i, length in enumerate(lengths)
        ]

    def tables(self, capacity: int) -> None:
        """Per layer, linear_pos of relative positions 0..capacity-1, as [heads, head size, positions] (a matrix
        product's operand), or [heads, positions, head size] for the kernel (a position's entries read together)."""
        encoding = relative_encoding(self.encoder.embed.pos_enc, capacity).to(device=self.device, dtype=self.dtype)
        _, heads, dim = self.shape
        order = (1, 0, 2) if self.kernel else (1, 2, 0)
        self.rel = [
            layer.self_attn.linear_pos(encoding).view(capacity, heads, dim).permute(*order).contiguous()
            for layer in self.encoder.encoders
        ]
        self.positions = torch.arange(capacity, device=self.device)

    def forward(self, rows: int, length: int) -> torch.Tensor:
        lengths = self.cache.lengths[:rows]  # the new token's position in each row
        x = self.llm.speech_embedding.weight[self.cache.tokens[:rows]]
        x = self.encoder.embed.out(x) * self.encoder.embed.pos_enc.xscale
        beyond = distance = None  # the kernel walks each row's own positions
        if not self.kernel:
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
        if self.kernel:
            relative = (self.rel[i], attention.pos_bias_u, attention.pos_bias_v)
            keys, values = self.cache.k[i, :rows], self.cache.v[i, :rows]
            context = decode_attention(q, keys, values, lengths, length, 1 / math.sqrt(dim), relative)
            return attention.linear_out(context.reshape(rows, heads * dim))
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
