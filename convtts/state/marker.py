"""What a shard's done marker records of the finished shard, so that a rerun trusts it by a few sizes.

Opening every audio file of a finished job to see it is whole costs about 0.15 ms a file: an hour
of disk reads at a million conversations, on every cron run that finds nothing to do. The marker
(work/shard-X.stats.json, written last) keeps, under FACTS:

    {"rows": 191, "ids": "<digest of the planned ids, in order>", "plan": 80312,
     "manifests": {"shard-00042.w0.manifest.jsonl": 190233}, "audio": {"<id>.wav": 2250, ...}}

and a rerun compares the plan file's size, each manifest's size and each audio file's size, from
one listing of the shard's audio folder. A file deleted, cut short or grown, a manifest line
rewritten or a plan shard made again shows as a changed size; damage that keeps a file's size
(bytes overwritten in place) is found by the full check, which `--verify` asks for.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from convtts.state.layout import Layout

FACTS = "facts"


def ids_digest(ids: list[str]) -> str:
    """The planned ids of a shard, in order: the shard the marker speaks of, for any later reader."""
    return hashlib.blake2b("\n".join(ids).encode(), digest_size=16).hexdigest()


def folder_sizes(folder: Path) -> dict[str, int]:
    """Each file of a folder by name, and its size; hidden temporaries (.NAME.tmpPID) left out."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return {}
    sizes = {}
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            sizes[entry.name] = entry.stat().st_size
        except FileNotFoundError:
            continue  # removed between the listing and its stat
    return sizes


def file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def facts_of(layout: Layout, shard: str, ids: list[str], manifests: list[Path]) -> dict:
    """A finished shard's facts, as they are on disk now."""
    return {
        "rows": len(ids),
        "ids": ids_digest(ids),
        "plan": file_size(layout.shard_file(shard)),
        "manifests": {path.name: file_size(path) for path in manifests},
        "audio": folder_sizes(layout.audio_dir(shard)),
    }


def facts_differ(layout: Layout, shard: str, facts: dict, manifests: list[Path]) -> str | None:
    """What is no longer as the marker recorded it, in words; None when every size is the same."""
    if file_size(layout.shard_file(shard)) != facts.get("plan"):
        return "its plan file changed"
    recorded = facts.get("manifests")
    now = {path.name: file_size(path) for path in manifests}
    if now != recorded:
        return f"its manifest files changed ({_first_change(recorded, now)})"
    audio = facts.get("audio")
    now = folder_sizes(layout.audio_dir(shard))
    if now != audio:
        return f"its audio changed ({_first_change(audio, now)})"
    return None


def _first_change(before, now: dict) -> str:
    before = before if isinstance(before, dict) else {}
    for name in sorted(before.keys() | now.keys()):
        if name not in now:
            return f"{name} is gone"
        if name not in before:
            return f"{name} is new"
        if before[name] != now[name]:
            return f"{name} was {before[name]} bytes, is {now[name]}"
    return "no file"
