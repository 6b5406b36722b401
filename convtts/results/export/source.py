"""Reading a finished output directory for export: its manifest, streamed, in units of whole plan shards.

A unit is a run of consecutive plan shards holding at most `shard_rows` planned segments (one shard
at least). Its bounds come from the plan, which does not change when a rerun speaks more rows, so a
re-export redoes only the units whose manifest lines changed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from convtts.results.merge import planned_segments
from convtts.state.layout import Layout
from convtts.state.rows import EXPORTED

FIELDS = EXPORTED  # the manifest fields a user trains with (convtts/state/rows.py)


class SourceError(ValueError):
    """The output directory cannot be exported as it is (no manifest, a broken line, missing audio)."""


@dataclass
class Unit:
    name: str  # the number of its first plan shard, e.g. "00040"
    planned: int  # segments the plan holds for it: an upper bound on its rows
    lines: list[bytes]  # its manifest lines, in manifest order

    def fingerprint(self, options: str) -> str:
        digest = hashlib.blake2b(options.encode(), digest_size=16)
        for line in self.lines:
            digest.update(line)
            digest.update(b"\n")
        return digest.hexdigest()

    def rows(self) -> Iterator[dict]:
        for line in self.lines:
            yield orjson.loads(line)


def check_source(layout: Layout) -> None:
    if not layout.manifest_file.is_file():
        raise SourceError(
            f"no manifest in {layout.root} ({layout.manifest_file.name} is missing): "
            "run run_all.sh (or python -m convtts.results.merge) on it first"
        )
    if not layout.shard_names():
        raise SourceError(f"no plan in {layout.root} ({layout.shards_dir} holds no shards)")


def unit_of_shard(layout: Layout, shard_rows: int) -> tuple[dict[str, str], dict[str, int]]:
    """{plan shard: unit name} and {unit name: planned segments}, packing shards in plan order.

    Each shard's count is the merge's (merge/state.json, while the plan is the one it merged), else
    its lines counted."""
    counted = planned_segments(layout) or {}
    owner: dict[str, str] = {}
    planned: dict[str, int] = {}
    current = None
    for shard in layout.shard_names():
        count = counted.get(shard)
        if not isinstance(count, int):
            count = _count_lines(layout.shard_file(shard))
        if current is None or planned[current] + count > shard_rows:
            current = shard.rpartition("-")[2]
            planned[current] = 0
        owner[shard] = current
        planned[current] += count
    return owner, planned


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def read_units(layout: Layout, shard_rows: int) -> Iterator[Unit]:
    """Every unit of the plan in order, with its manifest lines (none for a unit nothing was spoken for).

    merge writes the manifest shard by shard in plan order, so a unit's lines are consecutive and
    only one unit is held in memory at a time.
    """
    owner, planned = unit_of_shard(layout, shard_rows)
    order = list(planned)
    position = 0
    lines: list[bytes] = []
    for number, line, shard in _manifest_lines(layout):
        if shard not in owner:
            raise SourceError(
                f"{layout.manifest_file}:{number}: its audio is not under a planned shard "
                f"({shard}); the plan changed after the merge: run run_all.sh again"
            )
        unit = owner[shard]
        while order[position] != unit:
            yield Unit(order[position], planned[order[position]], lines)
            lines = []
            position += 1
            if position == len(order):
                raise SourceError(
                    f"{layout.manifest_file}:{number}: rows are not in plan order; "
                    "run python -m convtts.results.merge on the output again"
                )
        lines.append(line)
    for name in order[position:]:
        yield Unit(name, planned[name], lines)
        lines = []


def _manifest_lines(layout: Layout) -> Iterator[tuple[int, bytes, str]]:
    """(line number, line, plan shard) for each row; the shard is the folder of its audio, audio/shard-NNNNN/."""
    with open(layout.manifest_file, "rb") as fh:
        for number, line in enumerate(fh, 1):
            line = line.rstrip(b"\n")
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                shard = Path(row["audio"]).parent.name
                check_row(row)
            except (orjson.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
                raise SourceError(f"{layout.manifest_file}:{number}: not a manifest row ({exc})") from None
            yield number, line, shard


def check_row(row: dict) -> None:
    for key in ("id", "text", "audio", "num_samples", "sample_rate"):
        if key not in row:
            raise KeyError(key)


def export_fields(row: dict) -> dict:
    """The fields a user keeps, with the exact duration (the manifest rounds it to 0.1 ms)."""
    kept = {key: row.get(key) for key in FIELDS}
    kept["duration"] = row["num_samples"] / row["sample_rate"]
    return kept
