"""One shard's share of the merged outputs (its manifest, failures and conversation lines, and its
counts), kept in merge/ with the facts of the files it was made from, so that a merge remakes only
the shards whose files changed and streams the rest.

A part file is a header line, then the manifest, failures and conversation bytes back to back:

    {"version": 1, "facts": [1, true, [["plan/shards/shard-00042.jsonl", 80312, 1795000000123456789],
     ..., ["audio/shard-00042", 12288, 1795000000523456789]]], "racy": false, "sizes": [130211, 2210, 48210],
     "digest": "...", "counts": {...}, "carry": {"c17": {"0": {"audio": [...], "language": "en"}}},
     "head": {"cid": "c9", "length": 2210, "turns": {...}}}

(facts: the part's version, whether audio was checked, each file's path, size and time; carry: the
audio of conversations whose record is in a later shard; head: the first record's conversation,
the length of its line, and its turns here, for when it began in an earlier shard.)
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import orjson

from convtts.results.report import QualityTally
from convtts.state.layout import Layout, WorkListing
from convtts.state.shardio import DROPPED, KEPT, load_done, load_failures, read_jsonl

log = logging.getLogger(__name__)

PART_VERSION = 1
# A file changed this close to the moment its facts were taken may change again within the same
# timestamp tick, unseen: a part made from such a file is remade by the next merge.
RACY_NS = 2_000_000_000
_JSON = orjson.OPT_NON_STR_KEYS  # turn numbers are dict keys


@dataclass
class Counts:
    """One shard's figures for summary.json; the job's are their sum."""

    conversations: int = 0
    segments: int = 0
    done: int = 0
    failed: int = 0
    pending: int = 0
    dropped: int = 0  # every take refused, and validate.on_fail: drop (settled, not spoken)
    audio_seconds: float = 0.0
    runs: Counter = field(default_factory=Counter)  # rows by the run that spoke them
    run_seconds: Counter = field(default_factory=Counter)  # their audio, by run
    backends: set = field(default_factory=set)
    quality: QualityTally = field(default_factory=QualityTally)

    _SUMS = ("conversations", "segments", "done", "failed", "pending", "dropped", "audio_seconds")

    def add(self, other: Counts) -> None:
        for name in self._SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.runs.update(other.runs)
        self.run_seconds.update(other.run_seconds)
        self.backends |= other.backends
        self.quality.add(other.quality)

    def to_json(self) -> dict:
        data = {name: getattr(self, name) for name in self._SUMS}
        data.update(runs=dict(self.runs), run_seconds=dict(self.run_seconds), backends=sorted(self.backends))
        data["quality"] = self.quality.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict) -> Counts:
        counts = cls(**{name: data[name] for name in cls._SUMS})
        counts.runs, counts.run_seconds = Counter(data["runs"]), Counter(data["run_seconds"])
        counts.backends = set(data["backends"])
        counts.quality = QualityTally.from_json(data["quality"])
        return counts


@dataclass
class Part:
    header: dict
    manifest: bytes
    failures: bytes
    conversations: bytes  # each record as ",\n{...}": the outputs' separators, the first one's comma cut

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.header, option=_JSON) + b"\n" + self.manifest + self.failures + self.conversations

    @classmethod
    def from_bytes(cls, data: bytes) -> Part:
        end = data.index(b"\n")
        header = orjson.loads(data[:end])
        m, f, c = header["sizes"]
        body = memoryview(data)[end + 1 :]
        return cls(header, body[:m], body[m : m + f], body[m + f : m + f + c])

    @property
    def counts(self) -> Counts:
        return Counts.from_json(self.header["counts"])


def facts(layout: Layout, shard: str, listing: WorkListing, check_audio: bool) -> tuple[list, bool]:
    """(what the shard's part depends on, whether a file changed too recently to be trusted next time).

    Each input file's size and time, and the audio folder's time: writing, renaming or deleting a
    file there changes it. An audio file cut short in place is not seen here (the slot's check
    finds it, and so does a merge with the parts removed)."""
    taken = time.time_ns()
    paths = [layout.shard_file(shard), layout.shard_conversations(shard)]
    paths += [*listing.manifests(shard), *listing.failure_files(shard), layout.audio_dir(shard)]
    found = []
    for path in paths:
        try:
            stat = os.stat(path)
            found.append([str(path.relative_to(layout.root)), stat.st_size, stat.st_mtime_ns])
        except FileNotFoundError:
            found.append([str(path.relative_to(layout.root)), None, None])
    racy = any(mtime and mtime > taken - RACY_NS for _, _, mtime in found)
    return [PART_VERSION, check_audio, found], racy


def current_header(layout: Layout, shard: str, facts_now: list) -> dict | None:
    """The shard's part header when the part was made from files as they are now, else None."""
    try:
        with open(layout.merge_part(shard), "rb") as fh:
            line = fh.readline()
            size = os.fstat(fh.fileno()).st_size
        header = orjson.loads(line)
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    if not isinstance(header, dict) or header.get("racy", True) or header.get("facts") != facts_now:
        return None
    return header if size == len(line) + sum(header["sizes"]) else None


def read_part(layout: Layout, shard: str) -> Part:
    return Part.from_bytes(layout.merge_part(shard).read_bytes())


def first_record(layout: Layout, shard: str) -> dict:
    return read_jsonl(layout.shard_conversations(shard))[0]


def build(layout: Layout, shard: str, listing: WorkListing, facts_now: list, racy: bool) -> Part:
    """The shard's part from its plan and work files (the same lines a whole merge writes for it)."""
    check_audio, problems = facts_now[1], []
    done = load_done(layout, shard, paths=listing.manifests(shard), check_audio=check_audio, problems=problems)
    if problems:
        withdraw_marker(layout, shard, problems)
    failed = load_failures(layout, shard, listing.failure_files(shard))
    counts = Counts()
    manifest, failures = bytearray(), bytearray()
    turns = merge_rows(layout.shard_file(shard), (done, failed), counts, manifest, failures)
    conversations, head = bytearray(), None
    for item in read_jsonl(layout.shard_conversations(shard)):
        cid = item["conversation_id"]
        line = b",\n" + orjson.dumps(with_audio(item, turns.get(cid, {})))
        if head is None:  # only a shard's first conversation can have begun in an earlier shard
            head = {"cid": cid, "length": len(line), "turns": turns.get(cid, {})}
        turns.pop(cid, None)
        conversations += line
        counts.conversations += 1
    header = {"version": PART_VERSION, "facts": facts_now, "racy": racy, "carry": turns, "head": head}
    header.update(sizes=[len(manifest), len(failures), len(conversations)], counts=counts.to_json())
    digest = hashlib.blake2b(orjson.dumps([turns, head], option=_JSON), digest_size=16)
    for data in (manifest, failures, conversations):
        digest.update(data)
    header["digest"] = digest.hexdigest()
    return Part(header, bytes(manifest), bytes(failures), bytes(conversations))


def withdraw_marker(layout: Layout, shard: str, problems: list[str]) -> None:
    """A shard marked done whose rows or audio the merge found damaged loses its done marker: the
    next run checks it in full and speaks what is missing, as the closing line tells the user to
    (a marker's sizes would otherwise be trusted, and damage that keeps a file's size never mended)."""
    for problem in problems[:5]:
        log.warning("%s: %s", shard, problem)
    if layout.stats(shard).exists():
        layout.stats(shard).unlink(missing_ok=True)
        log.warning("%s: its done marker is withdrawn; the next run checks it in full and speaks the rest", shard)


def merge_rows(plan_file, results, counts: Counts, manifest, failures) -> dict:
    """Write one shard's rows in plan order, from its (done, failed) rows by id; return
    {conversation: {turn: {"audio": [paths], "language": its language}}}."""
    done, failed = results
    audio_by_turn: dict = {}
    for segment in read_jsonl(plan_file):
        uid = segment["id"]
        counts.segments += 1
        row = done.get(uid)
        if row is not None and row.get("status") == DROPPED:
            failures += orjson.dumps(row) + b"\n"
            counts.dropped += 1
            counts.quality.add_refused(row)
        elif row is not None:
            row = with_source_text(row, segment)
            if row.get("status") == KEPT:  # written, and listed with the refusals too
                failures += orjson.dumps(kept_failure(row)) + b"\n"
            manifest += orjson.dumps(row) + b"\n"
            count_spoken(counts, row)
            turns = audio_by_turn.setdefault(segment["conversation_id"], {})
            spoken = turns.setdefault(segment["turn"], {"audio": [], "language": segment.get("language")})
            spoken["audio"].append(row["audio"])
        elif uid in failed:
            failures += orjson.dumps(failed[uid]) + b"\n"
            counts.failed += 1
            counts.quality.add_failure(failed[uid])
        else:
            failures += orjson.dumps(pending_row(segment)) + b"\n"
            counts.pending += 1
    return audio_by_turn


def count_spoken(counts: Counts, row: dict) -> None:
    counts.done += 1
    counts.audio_seconds += row["duration"]
    counts.backends.add(row.get("backend"))
    counts.quality.add_row(row)
    if isinstance(row.get("run"), str):
        counts.runs[row["run"]] += 1
        counts.run_seconds[row["run"]] += row["duration"]


def pending_row(segment: dict) -> dict:
    pending = {k: segment.get(k) for k in ("id", "conversation_id", "turn", "segment", "role", "speaker", "text")}
    pending.update(status="pending", reason="not synthesised yet (the run stopped before it)")
    return pending


def kept_failure(row: dict) -> dict:
    """failures.jsonl's line for a take the gate refused and validate.on_fail kept: the refusal and
    its scores, and the audio that was kept."""
    keys = ("id", "conversation_id", "turn", "segment", "role", "speaker", "text", "status", "audio", "seed")
    line = {k: row.get(k) for k in keys}
    line.update(row.get("refused") or {})
    line.update(quality=row.get("quality"), respeaks=row.get("respeaks"), respoken_for=row.get("respoken_for"))
    line.update(backend=row.get("backend"), run=row.get("run"), time=row.get("finished"))
    return line


def with_source_text(row: dict, segment: dict) -> dict:
    """The turn's source text on its first segment's row alone, as the plan holds it (rows spoken
    under plan version 1 carry it on every segment)."""
    source = segment.get("source_text")
    return row if row.get("source_text") == source else {**row, "source_text": source}


def turn_keys(turns: dict) -> dict:
    """A part's turns read back: JSON gave the turn numbers as strings."""
    return {int(turn): spoken for turn, spoken in turns.items()}


def with_audio(item: dict, turns: dict) -> dict:
    """The input record in its own shape, each turn given `audio` (its segments' files in order) and,
    where it was spoken, `language`.

    An Alpaca record, whose turns are fields, gets `audio`: {"instruction": [...], "output": [...]}
    (the instruction's list speaks its input too), and `language` likewise for the fields spoken."""
    record = item["record"]
    if not isinstance(record, dict):
        return record
    key = next((k for k in ("conversations", "messages") if k in record), None)
    if key is None and "instruction" in record:
        fields = {field: _spoken(turns.get(index)) for index, field in enumerate(("instruction", "output"))}
        languages = {field: turn["language"] for field, turn in fields.items() if turn.get("language")}
        return {**record, "audio": {field: turn["audio"] for field, turn in fields.items()}, "language": languages}
    if key is not None and isinstance(record[key], list):
        record = dict(record)
        record[key] = [
            {**turn, **_spoken(turns.get(index))} if isinstance(turn, dict) else turn
            for index, turn in enumerate(record[key])
        ]
    return record


def _spoken(turn: dict | None) -> dict:
    if turn is None:
        return {"audio": []}
    return turn if turn["language"] is not None else {"audio": turn["audio"]}  # plans made before languages
