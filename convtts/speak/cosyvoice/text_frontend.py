"""The runtime's text frontend as the backend uses it: its normalisation and split of a text, each
piece within the text tokens the batched engine's KV cache was sized for, and the text spoken as
written where the frontend breaks on it. Apart from backend.py: what text reaches the model, not how
the model is driven.
"""

from __future__ import annotations

import logging

from convtts.config import Config
from convtts.speak.cosyvoice.chunks import within_budget
from convtts.speak.cosyvoice.failures import raised_at

log = logging.getLogger(__name__)


def chunk_budget(config: Config) -> int:
    """Text tokens a chunk of the batched path may hold: what the static KV cache was sized for; 0 (no
    bound) where upstream's decode runs, whose cache grows with each row."""
    from convtts.speak.cosyvoice.row_memory import text_tokens

    return text_tokens(config) if config.tts.cosyvoice.decode == "static" else 0


def normalized(frontend, text: str, text_frontend: bool, budget: int = 0) -> list[str]:
    """The runtime's text normalisation and split of `text`, each piece within `budget` text tokens
    (chunks.within_budget; 0: as the runtime splits it)."""
    parts = frontend_split(frontend, text, text_frontend)
    if not budget:
        return parts
    special = getattr(frontend, "allowed_special", "all")
    return within_budget(parts, lambda part: len(frontend.tokenizer.encode(part, allowed_special=special)), budget)


def frontend_split(frontend, text: str, text_frontend: bool) -> list[str]:
    """The runtime's text normalisation and split of `text`; where it breaks on a text (some releases
    index an empty sentence, 'string index out of range' in split_paragraph, on OCR-token lists), the
    text as the planner cleaned it, in one piece, with a warning: spoken as written beats failing the
    utterance on every rerun."""
    try:
        return frontend.text_normalize(text, split=True, text_frontend=text_frontend)
    except Exception as exc:
        if not text_frontend:
            raise
        log.warning(
            "the text frontend failed on %r (%s: %s%s); speaking it as written",
            text,
            type(exc).__name__,
            exc,
            raised_at(exc),
        )
        return frontend.text_normalize(text, split=True, text_frontend=False)
