"""Speaks manifest rows again in a process of its own, with the runtime a pipeline run used.

The test process keeps one CosyVoice runtime imported (the installed package); a checkout can only
be loaded in a fresh process. Writes, per row, the text tokens of each chunk the frontend makes and
the audio spoken with the row's speaker and seed, by a model that was never rebuilt; where the
settings batch, the rows again through the batched engine in one call, the flow waiting for two
decoded rows so that the first two share their flow and vocoder passes whatever the timing:

    python tests/cosyvoice_probe.py CONFIG.json ROWS.json OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(config_path: str, rows_path: str, out_dir: str) -> int:
    from convtts.config import load_config
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend
    from convtts.testing.cosyvoice_v1 import text_token_counts

    settings = json.loads(Path(config_path).read_text())
    together = ["tts.cosyvoice.flow.flush_share=1.0"]  # the batched call only: upstream's path has no flow passes
    backend = CosyVoiceBackend(load_config(settings["config"], settings["overrides"] + together))
    out = Path(out_dir)
    report = {"runtime": str(Path(sys.modules["cosyvoice"].__path__[0]).resolve()), "rows": {}}
    rows = json.loads(Path(rows_path).read_text())
    for row in rows:
        tokens = text_token_counts(backend.model.frontend, row["text"])
        audio = backend.synthesize(row["text"], row["speaker"], row["seed"])
        np.save(out / f"{row['id']}.npy", audio)
        report["rows"][row["id"]] = tokens
    if backend.engine is not None:
        items = [(row["id"], row["text"], row["speaker"], row["seed"]) for row in rows]
        for uid, audio in backend.synthesize_many(items):
            if isinstance(audio, BaseException):
                raise audio
            np.save(out / f"{uid}.together.npy", audio)
        vocoder = backend.engine.audio.vocoder
        report["shared_vocoder_passes"] = vocoder.passes - vocoder.alone
    tokenizer = backend.model.frontend.tokenizer.tokenizer
    report["endofprompt_id"] = tokenizer.convert_tokens_to_ids("<|endofprompt|>")
    (out / "report.json").write_text(json.dumps(report))
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
