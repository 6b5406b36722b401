"""v2/v3's LLM (a Hugging Face Qwen2 between upstream's speech embeddings and its speech-token head).

The prompt is built as Qwen2LM.inference builds it and prefilled through the backbone (without
its 151,936-way text head, which upstream computes and never reads). The upstream runner steps
the backbone for all live rows over a left-padded cache; the static runner steps our own code
from the same weights: RMSNorm, rotary positions per row, grouped-query attention over the
row's own place, SwiGLU, the final norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.attention import decode_attention
from convtts.speak.cosyvoice.engine.prefill_qwen import QwenPrefill, rotate
from convtts.speak.cosyvoice.engine.runner import StaticRunner, UpstreamRunner, on_device

END_OF_PROMPT_ID = 151646  # <|endofprompt|>: CosyVoice3 asserts it in every prompt


def cache_tensors(cache) -> list[torch.Tensor]:
    """A Hugging Face KV cache as [keys 0, values 0, keys 1, ...], each [rows, heads, time, dim]."""
    if hasattr(cache, "layers"):  # transformers 5
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    return [t for pair in zip(cache.key_cache, cache.value_cache) for t in pair]


def make_cache(tensors: list[torch.Tensor]):
    from transformers import DynamicCache

    pairs = list(zip(tensors[0::2], tensors[1::2]))
    if hasattr(DynamicCache, "from_legacy_cache"):  # transformers 4
        return DynamicCache.from_legacy_cache(tuple(pairs))
    return DynamicCache(pairs)


class QwenPrompt:
    """The prompt [sos, prompt text + text, task id, prompt speech] and its prefill through the backbone."""

    def __init__(self, llm, device):
        self.llm, self.device = llm, device
        self.causal_lm = llm.llm.model  # Qwen2ForCausalLM
        self.backbone = self.causal_lm.model  # without the text head
        self.is_v3 = type(llm).__name__ == "CosyVoice3LM"
        # v2 keeps sos and task id in llm_embedding; v3 has none and keeps them in speech_embedding
        self.specials = llm.speech_embedding if self.is_v3 else llm.llm_embedding
        self.sos = getattr(llm, "sos", getattr(llm, "sos_eos", 0))

    def embeddings(self, chunk: dict) -> torch.Tensor:
        device, llm = self.device, self.llm
        parts = [chunk.get("prompt_text", torch.zeros(1, 0, dtype=torch.int32)), chunk["text"]]
        if self.is_v3 and not any(bool((part == END_OF_PROMPT_ID).any()) for part in parts):  # on the host: no wait
            raise ValueError("CosyVoice3 needs <|endofprompt|> in the prompt text or the text")
        text = torch.concat([on_device(part, device) for part in parts], dim=1)
        text_emb = self.causal_lm.get_input_embeddings()(text)
        sos = self.specials.weight[self.sos].reshape(1, 1, -1)
        task = self.specials.weight[llm.task_id].reshape(1, 1, -1)
        speech = on_device(chunk.get("llm_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32)), device)
        speech_emb = (
            llm.speech_embedding(speech)
            if speech.shape[1]
            else torch.zeros(1, 0, llm.llm_input_size, dtype=text_emb.dtype, device=device)
        )
        return torch.concat([sos, text_emb, task, speech_emb], dim=1)

    def prefill(self, chunk: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(last hidden state [1, width], the cache as [keys 0, values 0, ...])."""
        hidden, layers, _ = self.prefill_rows([chunk])
        return hidden, layers

    def prefill_rows(self, chunks: list[dict]) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
        """Several prompts padded on the right in one forward (each row's positions and keys are its own):
        each one's last hidden state [rows, width], the cache as [keys 0, values 0, ...] ([rows, heads,
        longest, dim], padding past each row's length) and the prompts' lengths."""
        embedded = [self.embeddings(chunk)[0] for chunk in chunks]
        lengths = [len(e) for e in embedded]
        lm_input = torch.nn.utils.rnn.pad_sequence(embedded, batch_first=True)
        own = torch.tensor(lengths, device=self.device)
        mask = (torch.arange(lm_input.shape[1], device=self.device)[None, :] < own[:, None]).long()
        out = self.backbone(inputs_embeds=lm_input, attention_mask=mask, use_cache=True)
        last = out.last_hidden_state[torch.arange(len(chunks), device=self.device), own - 1]
        return last, cache_tensors(out.past_key_values), lengths

    def length(self, chunk: dict) -> int:
        """The prompt's positions: sos, prompt text and text, task id, prompt speech."""
        speech = chunk.get("llm_prompt_speech_token", torch.zeros(1, 0))
        text = chunk.get("prompt_text", torch.zeros(1, 0)).shape[1] + chunk["text"].shape[1]
        return 2 + text + speech.shape[1]


class UpstreamQwenRunner(UpstreamRunner):
    """Decode steps through the Hugging Face backbone over one left-padded cache (pads masked, own positions)."""

    def __init__(self, llm, device, precision, options):
        super().__init__(llm, device, precision, options)
        self.builder = QwenPrompt(llm, device)

    def prompt(self, seq):
        hidden, layers = self.builder.prefill(seq.chunk)
        return self.logp(hidden), layers

    def forward(self, seqs) -> torch.Tensor:
        tokens = torch.tensor([seq.tokens[-1] for seq in seqs], device=self.device)
        xs = self.llm.speech_embedding.weight[tokens].unsqueeze(1)
        length = self.cache.layers[0].shape[2]
        pads = torch.tensor([seq.pad for seq in seqs], device=self.device)
        mask = (torch.arange(length + 1, device=self.device)[None, :] >= pads[:, None]).long()
        out = self.builder.backbone(
            inputs_embeds=xs,
            attention_mask=mask,
            position_ids=(length - pads)[:, None],
            past_key_values=make_cache(self.cache.layers),
            use_cache=True,
        )
        self.cache.layers = cache_tensors(out.past_key_values)
        for seq in seqs:
            seq.launched += 1
        return self.logp(out.last_hidden_state[:, -1])


def supports_static(llm) -> bool:
    """Our step reproduces Qwen2 decoder layers with default rotary positions and no sliding window."""
    backbone = llm.llm.model.model
    config = backbone.config
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return (
        type(backbone).__name__ == "Qwen2Model"
        and rope.get("rope_type", rope.get("type", "default")) == "default"
        and not getattr(config, "use_sliding_window", False)
        and config.hidden_act == "silu"
    )


class QwenRunner(StaticRunner):
    """v2/v3 decode steps of our own over the static cache, from the Qwen2 backbone's own weights."""

    batched = True  # prompts(): chunks admitted together prefill in one forward

    def __init__(self, llm, device, precision, options):
        self.builder = QwenPrompt(llm, device)
        backbone = self.builder.backbone
        config = backbone.config
        self.heads = config.num_attention_heads
        self.query_group = self.heads // config.num_key_value_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        super().__init__(
            llm,
            device,
            precision,
            options,
            config.num_hidden_layers,
            config.num_key_value_heads,
            dim,
            llm.llm_decoder.out_features,
        )
        self.backbone = backbone
        self.layers = list(backbone.layers)
        self.qkv = [
            fused(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj) for layer in self.layers
        ]
        self.gate_up = [fused(layer.mlp.gate_proj, layer.mlp.up_proj)[0] for layer in self.layers]
        if options.prefill == "static" or (options.prefill == "auto" and self.device.type == "cuda"):
            self.prefiller = QwenPrefill(self, graphs=options.cuda_graphs)

    def embedded(self, seq) -> torch.Tensor:
        return self.builder.embeddings(seq.chunk)[0]

    def prompt(self, seq):
        hidden, layers = self.builder.prefill(seq.chunk)
        return self.logp(hidden), layers[0::2], layers[1::2]

    def prompt_length(self, seq) -> int:
        return self.builder.length(seq.chunk)

    def prompts(self, seqs) -> list[tuple]:
        """prompt() of several chunks in one padded forward; per chunk, in order, what prompt() returns."""
        hidden, layers, lengths = self.builder.prefill_rows([seq.chunk for seq in seqs])
        logp = self.logp(hidden)
        return [
            (
                logp[i : i + 1],
                [keys[i : i + 1, :, :length] for keys in layers[0::2]],
                [values[i : i + 1, :, :length] for values in layers[1::2]],
            )
            for i, length in enumerate(lengths)
        ]

    def tables(self, capacity: int) -> None:
        """cos and sin of every position the cache can hold."""
        self.cos, self.sin = self.rotary_tables(capacity)
        self.positions = torch.arange(capacity, device=self.device)

    def rotary_tables(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [positions, head size] of positions 0, 1, ..., computed as the backbone's rotary module does."""
        rotary = self.backbone.rotary_emb
        angles = (
            torch.arange(positions, device=self.device).float()[:, None]
            * rotary.inv_freq.to(device=self.device, dtype=torch.float)[None, :]
        )
        angles = torch.cat((angles, angles), dim=-1)
        scale = getattr(rotary, "attention_scaling", 1.0)
        return (angles.cos() * scale).to(self.dtype), (angles.sin() * scale).to(self.dtype)

    def forward(self, rows: int, length: int) -> torch.Tensor:
        lengths = self.cache.lengths[:rows]  # the new token's position in each row
        x = self.llm.speech_embedding.weight[self.cache.tokens[:rows]]
        cos, sin = self.cos[lengths].unsqueeze(1), self.sin[lengths].unsqueeze(1)
        beyond = None if self.kernel else (self.positions[:length][None, :] > lengths[:, None])[:, None, None, :]
        for i, layer in enumerate(self.layers):
            x = x + self.attend(i, layer.self_attn, layer.input_layernorm(x), lengths, cos, sin, beyond, length)
            h = layer.post_attention_layernorm(x)
            gate, up = F.linear(h, self.gate_up[i]).chunk(2, dim=-1)
            x = x + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
        return self.backbone.norm(x)

    def attend(self, i: int, attention, x, lengths, cos, sin, beyond, length: int) -> torch.Tensor:
        rows = x.shape[0]
        _, groups, dim = self.shape
        q, k, v = F.linear(x, *self.qkv[i]).split([self.heads * dim, groups * dim, groups * dim], dim=-1)
        q = rotate(q.view(rows, self.heads, dim), cos, sin)
        k = rotate(k.view(rows, groups, dim), cos, sin)
        self.cache.write(i, rows, lengths, k, v.view(rows, groups, dim))
        if self.kernel:  # each row's own positions (attention.py); query heads of a key head read it in turn
            keys, values = self.cache.k[i, :rows], self.cache.v[i, :rows]
            context = decode_attention(q, keys, values, lengths, length, attention.scaling)
            return attention.o_proj(context.reshape(rows, self.heads * dim))
        keys, values = self.cache.k[i, :rows, :, :length], self.cache.v[i, :rows, :, :length]
        q = q.view(rows, groups, self.heads // groups, dim)  # the query heads sharing each key head
        scores = torch.matmul(q, keys.transpose(-1, -2)) * attention.scaling
        weights = torch.softmax(scores.masked_fill(beyond, -float("inf")), dim=-1, dtype=torch.float32).to(q.dtype)
        context = torch.matmul(weights, values).reshape(rows, self.heads * dim)
        return attention.o_proj(context)


def fused(*linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linear layers on the same input as one weight and bias (one matrix product)."""
    weight = torch.cat([linear.weight for linear in linears])
    if all(linear.bias is None for linear in linears):
        return weight, None
    return weight, torch.cat(
        [linear.bias if linear.bias is not None else torch.zeros_like(linear.weight[:, 0]) for linear in linears]
    )
