"""Batched CosyVoice synthesis (v1, v2, v3): many utterances share each LLM decode step and each flow pass.

Upstream speaks one utterance per call (its decode asserts a batch of one), so a worker's GPU
waits on kernel launches most of the time. This engine drives upstream's own modules and weights
as the official classes loaded them, in a loop of ours:

- the text frontend runs per utterance, exactly as `inference_sft` / `inference_zero_shot` do;
- the LLM prefill runs per utterance through upstream's `forward_chunk`; the decode steps then
  run all live rows through the encoder layers together, with a left-padded KV cache and masks,
  and rows join as others finish (continuous batching);
- each row samples with upstream's own sampling rule on its own random stream, so an utterance
  sounds the same whichever rows it shared a batch with (up to float rounding);
- flow matching runs for the finished rows together (padding and masks, CUDA graphs on a GPU),
  then the vocoder for them, several rows per pass; each row as it would be alone.

Modules: requests (an utterance and its rows), engine (v1's loop), qwen (v2/v3's LLM steps),
sampler (the sampling rule, per-row random streams), flow (the batched flow passes), estimator
(the flow estimators re-driven for padding), solver (the Euler solve: eager, bucketed, graphs),
vocoder and hift (HiFT for several rows), precision (number formats per part), sizing (memory per row).
"""
