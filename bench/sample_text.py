"""The text the benchmarks speak: the repository's sample conversations by default, or any input file."""

from __future__ import annotations

from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEXT = REPO / "tests" / "data" / "llava_style.json"
QUESTIONS = ("human", "user")
ANSWERS = ("gpt", "assistant")


def read_conversations(path: str | Path) -> list[dict]:
    """The records of a JSON array or a JSON lines file, the two shapes preprocess.py reads."""
    data = Path(path).read_bytes()
    if data.lstrip()[:1] == b"[":
        return orjson.loads(data)
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def turn_texts(records: list[dict], roles: tuple[str, ...]) -> list[str]:
    """The text of every turn spoken by one of `roles`, without its <image> placeholder."""
    out = []
    for record in records:
        for turn in record.get("conversations") or []:
            if not isinstance(turn, dict) or turn.get("from", turn.get("role")) not in roles:
                continue
            value = turn.get("value", turn.get("content"))
            if isinstance(value, str) and value.replace("<image>", "").strip():
                out.append(value.replace("<image>", "").strip())
    return out


def words(record: dict) -> int:
    """Words in a record's turns, all roles together."""
    return sum(len(text.split()) for text in turn_texts([record], QUESTIONS + ANSWERS))
