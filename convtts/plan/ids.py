"""A conversation's id and whether it is chosen: its input id made file-name safe (or a digest of its
content), repeats told apart in file order, and the seeded selection, decided by each id's hash alone
so that record order does not change it. Apart from planner.py, which reads the input and writes the
shards: these are the rules an id obeys, with no file in them.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import re
from collections import Counter

import orjson

from convtts.config import SelectConfig
from convtts.counts import plural

log = logging.getLogger(__name__)

MAX_ID_CHARS = 96  # room for '-000-00.flac' and a duplicate suffix within any file-name limit
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

# --- ids ---------------------------------------------------------------------------------------


def _digest(text: str, size: int) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).digest()


def safe_id(raw: str) -> str:
    """A file-name-safe id: [A-Za-z0-9._-] only, no leading dot or dash, at most MAX_ID_CHARS.

    Whenever sanitising changes the id, a hash of the original is appended, so '../../x' and
    '..\\x' stay apart: '../../x' -> '_.._x-55c35b3f', '..\\x' -> '_x-af7398ab'.
    """
    safe = _UNSAFE.sub("_", raw).lstrip(".-")
    if safe == raw and len(raw) <= MAX_ID_CHARS:
        return raw
    digest = _digest(raw, 4).hex()
    return f"{safe[: MAX_ID_CHARS - 9]}-{digest}" if safe else f"id-{digest}"


def base_id(record: dict) -> str:
    """The record's own id made safe, or one derived from its content when it has none."""
    raw = record.get("id")
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return safe_id(str(raw))
    if isinstance(raw, str) and raw.strip():
        return safe_id(raw)
    content = orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()
    return "auto-" + _digest(content, 8).hex()


def unique_ids(bases: list[str]) -> list[str]:
    """Ids used once stay as they are; every occurrence of a repeated one gets -1, -2, ... in file order."""
    counts = Counter(bases)
    taken = {b for b, n in counts.items() if n == 1}
    next_suffix: Counter = Counter()
    out = []
    for base in bases:
        if counts[base] == 1:
            out.append(base)
            continue
        while True:  # skip a suffixed name that another record already uses as its own id
            next_suffix[base] += 1
            name = f"{base}-{next_suffix[base]}"
            if name not in taken:
                break
        taken.add(name)
        out.append(name)
    return out


# --- selection (voices: convtts/plan/voices.py) ---------------------------------------------


def id_hash(seed: int, cid: str) -> int:
    return int.from_bytes(_digest(f"{seed}\0{cid}", 8), "big")


def select(ids: list[str], config: SelectConfig) -> list[int]:
    """Indices of the selected ids, in file order; decided by each id's seeded hash alone."""
    if config.fraction is None and config.count is None:
        return list(range(len(ids)))
    if config.fraction is not None:
        limit = config.fraction * 2**64
        return [i for i, cid in enumerate(ids) if id_hash(config.seed, cid) < limit]
    if config.count >= len(ids):
        log.warning("select.count=%d but only %s: keeping all", config.count, plural(len(ids), "conversation"))
        return list(range(len(ids)))
    return sorted(heapq.nsmallest(config.count, range(len(ids)), key=lambda i: (id_hash(config.seed, ids[i]), ids[i])))
