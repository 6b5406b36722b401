"""What a slot's workers import once, in the forkserver they are forked from, instead of each on its own.

Fourteen workers importing torch and the CosyVoice runtime at the same moment took 16.4 s each on
an H200 node's 16 cores (bench/results/h200-2026-11-24-e2e), against about 6 s for one process
alone: with workers.start_method forkserver the slot's server imports them once, while the plan
is being written, and every worker (and every restarted one) is forked with them in memory.

The forkserver imports this module by name, with the slot's environment; CONVTTS_PRELOAD (set by
the slot before the server starts) says what to import: JSON {"whisper": bool, "voice": null or the
voice's Resources.preload as {"function": "module:function", "args": {...}}}. Besides torch and the
worker, it imports transformers for Whisper, then calls the voice's function. A failure here is only
logged: each worker then imports for itself and reports its own error, as it does under spawn.

Nothing here may initialise CUDA, or no forked worker could use it: a library that asks
torch.cuda.is_available() as it loads is answered from NVML (PYTORCH_NVML_BASED_CUDA_CHECK).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time

ENV = "CONVTTS_PRELOAD"


def plan(config, needs) -> str:
    """The CONVTTS_PRELOAD value for a slot's config and its voice's Resources."""
    whisper = config.validate.enabled and config.validate.recogniser == "hf-whisper"
    voice = needs.preload and {"function": needs.preload.function, "args": dict(needs.preload.args)}
    return json.dumps({"whisper": whisper, "voice": voice}, sort_keys=True)


def preload(wanted: dict) -> dict[str, float]:
    """Import what `wanted` names; the seconds each step took, by name (the slot's log prints them: on
    an H200 node torch alone took 2.7-4.2 s from one job to the next, the rest 1.3-2.3 s)."""
    phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str):
        started = time.time()
        try:
            yield
        finally:
            phases[name] = round(phases.get(name, 0.0) + time.time() - started, 3)

    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    with phase("torch"):
        import torch  # noqa: F401  (every backend that wants a forkserver runs on torch)
    with phase("worker"):
        import convtts.run.worker  # noqa: F401
    if wanted.get("whisper"):
        with phase("transformers"):
            import transformers  # noqa: F401
    voice = wanted.get("voice")
    if voice:
        module, _, function = voice["function"].partition(":")
        getattr(importlib.import_module(module), function)(voice["args"], phase)
    return phases


def _run() -> None:
    raw = os.environ.get(ENV)
    if not raw:
        return
    started = time.time()
    try:
        seconds = preload(json.loads(raw))
    except BaseException as exc:
        print(
            f"convtts: the workers' forkserver could not preload ({type(exc).__name__}: {exc}); "
            "each worker imports for itself",
            file=sys.stderr,
        )
        return
    steps = ", ".join(f"{name} {took:.2f}" for name, took in seconds.items())
    print(f"convtts: the workers' forkserver imported in {time.time() - started:.2f} s ({steps})", file=sys.stderr)


_run()
