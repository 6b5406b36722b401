"""Reading and appending the per-shard JSON-lines files, tolerant of a half-written last line."""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import orjson

from convtts.layout import Layout


def read_jsonl(path: Path) -> list[dict]:
    """All complete lines of a JSON-lines file; a torn last line (a kill mid-write) is ignored."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    rows = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue  # only a torn tail can be invalid: we write whole lines in one call
    return rows


def drop_torn_tail(path: Path) -> None:
    """Cut a file back to its last newline so the next append starts on a fresh line."""
    try:
        with open(path, "rb+") as fh:
            data = fh.read()
            if data and not data.endswith(b"\n"):
                fh.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


def append_line(path: Path, row: dict) -> None:
    """Append one JSON line in a single write, flushed, so a kill leaves at most a torn tail."""
    with open(path, "ab") as fh:
        fh.write(orjson.dumps(row) + b"\n")
        fh.flush()


def write_json_atomic(path: Path, value) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(orjson.dumps(value, option=orjson.OPT_INDENT_2))
    os.replace(tmp, path)


def read_json(path: Path):
    try:
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def load_done(layout: Layout, shard: str) -> dict[str, dict]:
    """Manifest rows of a shard by id whose audio file is really there (the last row per id wins)."""
    rows = read_jsonl(layout.manifest(shard))
    done = {r["id"]: r for r in rows if "id" in r}
    return {i: r for i, r in done.items() if (layout.root / r["audio"]).is_file()}


def crash_counts(layout: Layout, shard: str, run_id: str) -> Counter:
    """How often a worker died on each utterance during this run."""
    return Counter(r["id"] for r in read_jsonl(layout.crashes(shard)) if r.get("run") == run_id)


def shard_complete(layout: Layout, shard: str) -> bool:
    """A shard is finished when its stats file, written last, says nothing failed."""
    stats = read_json(layout.stats(shard))
    return bool(stats) and stats.get("failed", 1) == 0 and stats.get("pending", 1) == 0
