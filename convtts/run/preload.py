"""What a slot's workers import once, in the forkserver they are forked from, instead of each on its own.

Fourteen workers importing torch and the CosyVoice runtime at the same moment took 16.4 s each on
an H200 node's 16 cores (bench/results/h200-2026-11-24-e2e), against about 6 s for one process
alone: with workers.start_method forkserver the slot's server imports them once, while the plan
is being written, and every worker (and every restarted one) is forked with them in memory.

The forkserver imports this module by name, with the slot's environment; CONVTTS_PRELOAD (set by
the slot before the server starts) says what to import: JSON {"cosyvoice_root": path or "",
"whisper": bool}. A failure here is only logged: each worker then imports for itself and reports
its own error, as it does under spawn.
"""

from __future__ import annotations

import json
import os
import sys

ENV = "CONVTTS_PRELOAD"


def plan(config) -> str:
    """The CONVTTS_PRELOAD value for a slot's config."""
    cosyvoice = config.tts.backend == "cosyvoice"
    whisper = config.validate.enabled and config.validate.recogniser == "hf-whisper"
    return json.dumps({"cosyvoice": cosyvoice, "cosyvoice_root": config.tts.cosyvoice.runtime_root, "whisper": whisper})


def preload(wanted: dict) -> None:
    import torch  # noqa: F401  (every backend that wants a forkserver runs on torch)

    import convtts.run.worker  # noqa: F401

    if wanted.get("cosyvoice"):
        from convtts.config import CosyVoiceConfig
        from convtts.speak.cosyvoice.runtime import import_runtime

        import_runtime(CosyVoiceConfig(runtime_root=wanted.get("cosyvoice_root", "")))
    if wanted.get("whisper"):
        import transformers  # noqa: F401


def _run() -> None:
    raw = os.environ.get(ENV)
    if not raw:
        return
    try:
        preload(json.loads(raw))
    except BaseException as exc:
        print(
            f"convtts: the workers' forkserver could not preload ({type(exc).__name__}: {exc}); "
            "each worker imports for itself",
            file=sys.stderr,
        )


_run()
