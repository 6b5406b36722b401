"""How a benchmark hands back its figures: indented JSON on stdout, and in --out when given."""

from __future__ import annotations

from pathlib import Path

import orjson


def report(figures: dict, out: str | Path | None) -> None:
    text = orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode()
    print(text)
    if out:
        Path(out).write_text(text + "\n")
