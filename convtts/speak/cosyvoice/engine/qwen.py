"""Batched CosyVoice2 / CosyVoice3 synthesis: many utterances share each step of the Qwen2 LLM.

The v2 and v3 LLMs are a Hugging Face Qwen2 model between upstream's speech embeddings and its
speech-token head; upstream decodes one utterance per call, each step a full pass of Python and
small kernels. This engine keeps v1's loop (convtts.speak.cosyvoice.engine.engine: continuous
batching, each row sampling by upstream's rule on its own random stream) and changes what is
model specific:

- the prompt [sos, text, task id, prompt speech] is built as Qwen2LM.inference builds it, for
  either release (v2 takes sos and task id from llm_embedding, v3 from speech_embedding);
- prefill and decode steps run the Qwen2 backbone without its text head (upstream computes
  151,936 text logits per token and never reads them), decode steps for all live rows at once
  over one left-padded KV cache, with an attention mask and each row's own positions;
- a decode ends on any of the model's stop tokens (3 for v2, 200 for v3);
- the flow runs for decoded rows of close lengths together (right padding; see flow.py), from
  the decoder's fixed noise as upstream does; the vocoder for several rows at once, as in v1.
"""
from __future__ import annotations

import torch

from convtts.speak.cosyvoice.engine.engine import BatchEngine, llm_kind, plain_flow
from convtts.speak.cosyvoice.engine.requests import Row

END_OF_PROMPT_ID = 151646  # <|endofprompt|>: CosyVoice3 asserts it in every prompt


def supports(model) -> bool:
    """v2/v3 with upstream's Qwen2Encoder backbone (not its vLLM engine), fp32, flow in PyTorch."""
    llm = getattr(getattr(model, "model", None), "llm", None)
    return (llm_kind(model) in ("Qwen2LM", "CosyVoice3LM") and type(getattr(llm, "llm", None)).__name__ == "Qwen2Encoder"
            and not hasattr(llm, "vllm") and plain_flow(model))


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


class QwenBatchEngine(BatchEngine):
    """BatchEngine for Qwen2LM (v2) and CosyVoice3LM (v3)."""

    def __init__(self, model, max_rows: int, precision=None, settings=None):
        super().__init__(model, max_rows, precision, settings)
        self.causal_lm = self.llm.llm.model  # Qwen2ForCausalLM
        self.backbone = self.causal_lm.model  # without the text head
        self.is_v3 = type(self.llm).__name__ == "CosyVoice3LM"
        # v2 keeps sos and task id in llm_embedding; v3 has none and keeps them in speech_embedding
        self.specials = self.llm.speech_embedding if self.is_v3 else self.llm.llm_embedding

    def _prefill(self, request, chunk: dict):
        lm_input, text_len, prompt_len = self._lm_input(chunk)
        out = self.backbone(inputs_embeds=lm_input, attention_mask=torch.ones(lm_input.shape[:2], dtype=torch.long, device=self.device),
                            use_cache=True)
        logp = self.llm.llm_decoder(out.last_hidden_state[:, -1]).log_softmax(dim=-1)
        text_only = text_len - prompt_len
        row = Row(request, chunk, min_len=int(text_only * self.min_ratio), max_len=int(text_only * self.max_ratio))
        return row, cache_tensors(out.past_key_values), logp

    def _lm_input(self, chunk: dict):
        """[sos, prompt text + text, task id, prompt speech] embeddings, as Qwen2LM.inference builds them."""
        device, llm = self.device, self.llm
        prompt_text = chunk.get("prompt_text", torch.zeros(1, 0, dtype=torch.int32)).to(device)
        text = torch.concat([prompt_text, chunk["text"].to(device)], dim=1)
        if self.is_v3 and not bool((text == END_OF_PROMPT_ID).any()):
            raise ValueError("CosyVoice3 needs <|endofprompt|> in the prompt text or the text")
        text_emb = self.causal_lm.get_input_embeddings()(text)
        sos = self.specials.weight[self.sos].reshape(1, 1, -1)
        task = self.specials.weight[llm.task_id].reshape(1, 1, -1)
        speech = chunk.get("llm_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32)).to(device)
        speech_emb = llm.speech_embedding(speech) if speech.shape[1] else \
            torch.zeros(1, 0, llm.llm_input_size, dtype=text_emb.dtype, device=device)
        return torch.concat([sos, text_emb, task, speech_emb], dim=1), text.shape[1], prompt_text.shape[1]

    def _step(self):
        """One decode step for every live row over the shared cache (pads masked, own positions)."""
        tokens = torch.tensor([row.tokens[-1] for row in self.rows], device=self.device)
        xs = self.llm.speech_embedding.weight[tokens].unsqueeze(1)
        length = self.kv[0].shape[2]
        pads = torch.tensor([row.pad for row in self.rows], device=self.device)
        mask = (torch.arange(length + 1, device=self.device)[None, :] >= pads[:, None]).long()
        out = self.backbone(inputs_embeds=xs, attention_mask=mask, position_ids=(length - pads)[:, None],
                            past_key_values=make_cache(self.kv), use_cache=True)
        self.kv = cache_tensors(out.past_key_values)
        return self.llm.llm_decoder(out.last_hidden_state[:, -1]).log_softmax(dim=-1)
