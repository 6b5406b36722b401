"""What a slot's workers import once, in the forkserver they are forked from, instead of each on its own.

Fourteen workers importing torch and the CosyVoice runtime at the same moment took 16.4 s each on
an H200 node's 16 cores (bench/results/h200-2026-11-24-e2e), against about 6 s for one process
alone: with workers.start_method forkserver the slot's server imports them once, while the plan
is being written, and every worker (and every restarted one) is forked with them in memory.

The forkserver imports this module by name, with the slot's environment; CONVTTS_PRELOAD (set by
the slot before the server starts) says what to import: JSON {"cosyvoice": bool, "cosyvoice_root":
path or "", "version": the model's CosyVoice generation or null, "model_dir": path, "whisper": bool}.
It imports the runtime and the modules the model's yaml names (runtime.import_model_modules), and
transformers for v2/v3 and for Whisper, which use it (v1 does not: speak.cosyvoice.standins). A
failure here is only logged: each worker then imports for itself and reports its own error, as it
does under spawn.

Nothing here may initialise CUDA, or no forked worker could use it: a library that asks
torch.cuda.is_available() as it loads is answered from NVML (PYTORCH_NVML_BASED_CUDA_CHECK).
"""

from __future__ import annotations

import json
import os
import sys
import time

ENV = "CONVTTS_PRELOAD"


def plan(config) -> str:
    """The CONVTTS_PRELOAD value for a slot's config."""
    cosyvoice = config.tts.backend == "cosyvoice"
    whisper = config.validate.enabled and config.validate.recogniser == "hf-whisper"
    cosy = config.tts.cosyvoice
    version = _model_version(cosy.model_dir) if cosyvoice else None
    wanted = {"cosyvoice": cosyvoice, "cosyvoice_root": cosy.runtime_root, "version": version}
    return json.dumps({**wanted, "model_dir": cosy.model_dir, "whisper": whisper})


def _model_version(model_dir: str) -> int | None:
    from convtts.config import ConfigError
    from convtts.speak.cosyvoice.runtime import model_version

    try:
        return model_version(model_dir)
    except ConfigError:
        return None  # the worker's own load says what is wrong


def preload(wanted: dict) -> dict[str, float]:
    """Import what `wanted` names; the seconds each step took, by name (the slot's log prints them: on
    an H200 node torch alone took 2.7-4.2 s from one job to the next, the rest 1.3-2.3 s)."""
    from convtts.speak.cosyvoice.loading import LoadClock  # the standard library only, like this module

    clock = LoadClock()
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    with clock.phase("torch"):
        import torch  # noqa: F401  (every backend that wants a forkserver runs on torch)
    with clock.phase("worker"):
        import convtts.run.worker  # noqa: F401
    if wanted.get("whisper") or (wanted.get("version") or 0) >= 2:
        with clock.phase("transformers"):
            import transformers  # noqa: F401
    if wanted.get("cosyvoice"):
        from convtts.config import CosyVoiceConfig
        from convtts.speak.cosyvoice.runtime import import_model_modules, import_runtime

        version = wanted.get("version")
        with clock.phase("runtime"):
            import_runtime(CosyVoiceConfig(runtime_root=wanted.get("cosyvoice_root", "")), version)
        if version:
            with clock.phase("model modules"):
                import_model_modules(wanted["model_dir"], version)
    return clock.phases


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
