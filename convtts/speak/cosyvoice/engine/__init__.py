"""Batched CosyVoice synthesis (v1, v2, v3): many utterances share each LLM decode step and each flow pass.

Upstream speaks one utterance per call (its decode asserts a batch of one), so a worker's GPU
waits on kernel launches most of the time. This engine drives upstream's own modules and weights
as the official classes loaded them, in a loop of ours, split as nano-vllm splits its engine:

- requests: a Request (one utterance) and its Sequences (one text chunk each, with a status);
- scheduler: sequences into free rows, decoded ones gathered for the flow, chunks chained;
- kvcache: a static cache (a fixed row per sequence, preallocated) or upstream's padded one;
- runner, runner_v1, runner_qwen: per model family, the prefill through upstream's modules and
  the decode step, upstream's layers or our own over the static cache (graphs: one CUDA graph
  per bucket of rows and cache length); prefill_qwen, v2/v3's prompts through our own forward of
  the backbone (one CUDA graph per bucket of prompts and width);
- sampler, readback: upstream's sampling rule on the CPU (exact) or on the GPU inside the step;
- engine (v1's loop), qwen (v2/v3), audio (the one caller of flow and vocoder);
- flow (rows of close lengths in one pass, padding that does not change a row), estimator (the
  flow estimators re-driven for padding), solver (the Euler solve: eager, bucketed, CUDA graphs),
  vocoder and hift (HiFT for several rows, each row's noise its own), precision (number formats
  per part), sizing (memory per row).

Each row samples on its own random stream, so an utterance sounds the same whichever rows it
shared a batch with (up to float rounding). docs/ARCHITECTURE.md (Batched synthesis) has the
design and the tolerance of each path.
"""
