"""Batched CosyVoice2 / CosyVoice3 synthesis: many utterances share each step of the Qwen2 LLM.

The v2 and v3 LLMs are a Hugging Face Qwen2 model between upstream's speech embeddings and its
speech-token head. This engine keeps v1's loop (convtts.speak.cosyvoice.engine.engine) and
changes what is model specific:

- the prompt [sos, text, task id, prompt speech] is built as Qwen2LM.inference builds it, for
  either release (v2 takes sos and task id from llm_embedding, v3 from speech_embedding), and
  its decode steps run the Qwen2 layers (runner_qwen);
- a decode ends on any of the model's stop tokens (3 for v2, 200 for v3);
- the flow runs for decoded rows of close lengths together (right padding; see flow_batch_causal),
  from the decoder's fixed noise as upstream does; the vocoder per utterance, as in v1.
"""

from __future__ import annotations

from convtts.speak.cosyvoice.engine.engine import BatchEngine, llm_kind, plain_flow
from convtts.speak.cosyvoice.engine.runner_qwen import END_OF_PROMPT_ID, QwenRunner, UpstreamQwenRunner, supports_static

__all__ = ["END_OF_PROMPT_ID", "QwenBatchEngine", "supports"]


def supports(model) -> bool:
    """v2/v3 with upstream's Qwen2Encoder backbone (not its vLLM engine), fp32, flow in PyTorch."""
    llm = getattr(getattr(model, "model", None), "llm", None)
    return (
        llm_kind(model) in ("Qwen2LM", "CosyVoice3LM")
        and type(getattr(llm, "llm", None)).__name__ == "Qwen2Encoder"
        and not hasattr(llm, "vllm")
        and plain_flow(model)
    )


class QwenBatchEngine(BatchEngine):
    """BatchEngine for Qwen2LM (v2) and CosyVoice3LM (v3)."""

    runners = {"upstream": UpstreamQwenRunner, "static": QwenRunner}

    def static_supported(self) -> bool:
        return supports_static(self.llm)
