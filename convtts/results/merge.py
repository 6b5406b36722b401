"""Merge the per-shard work files into the outputs people load: manifest, failures, conversations, summary."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import orjson

from convtts import EXIT_DISK_FULL, EXIT_FAILURES, EXIT_OK
from convtts.counts import plural
from convtts.results import shard_part
from convtts.results.report import iter_jsonl
from convtts.results.shard_part import Counts
from convtts.state.layout import Layout, WorkListing
from convtts.state.shardio import disk_full_text, is_disk_full, read_json, write_atomic, write_json_atomic

MERGE_STATE_VERSION = 1


@dataclass
class Totals:
    counts: Counts = field(default_factory=Counts)
    skipped_turns: int = 0
    skipped_languages: Counter = field(default_factory=Counter)  # of those, turns the voice does not speak
    digest: object = field(default_factory=lambda: hashlib.blake2b(digest_size=16))  # of every output line
    segments: dict = field(default_factory=dict)  # planned segments by shard, for export


@dataclass
class Merged:
    summary: dict
    unchanged: bool  # nothing differed from the last merge's outputs: only summary.json was written


class AtomicWriter:
    """Write a file under a temporary name; it replaces the real one only when complete."""

    def __init__(self, path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        self.fh = open(self.tmp, "wb")

    def write(self, data: bytes) -> None:
        self.fh.write(data)

    def close(self) -> None:
        self.fh.close()  # flushes: a full disk shows here, before any real file is replaced

    def commit(self) -> None:
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        try:
            self.fh.close()
        except OSError:
            pass  # the flush failed again (a full disk): the file goes anyway
        self.tmp.unlink(missing_ok=True)


def merge(
    layout: Layout,
    run_id: str | None = None,
    started: float | None = None,
    check_audio: bool = True,
    log_dir: str | None = None,
    force: bool = False,
) -> Merged:
    """Write the outputs whole or not at all: a failure (a full disk) leaves the previous ones as they were.

    Each shard's part is remade only when its files changed; when no part, and nothing else the
    outputs hold, differs from the last merge and the outputs are as it left them, only summary.json
    is written, for this run's figures (`force` writes them all anyway). `check_audio` False counts
    each row without opening its audio (--no-audio-check); `log_dir`, the run's log folder, is named
    in the summary."""
    remove_stale_temporaries(layout)
    totals = refresh_parts(layout, check_audio)
    state = read_json(layout.merge_state)
    combined = totals.digest.hexdigest()
    unchanged = not force and isinstance(state, dict) and state.get("combined") == combined
    unchanged = unchanged and state.get("outputs") == output_facts(layout)
    outputs = () if unchanged else (layout.manifest_file, layout.failures_file, layout.conversations_file)
    writers: list[AtomicWriter] = []
    try:
        writers += [AtomicWriter(path) for path in outputs]
        if writers:
            write_outputs(layout, *writers)
        summary = make_summary(layout, totals, run_id, started, log_dir)
        writers.append(AtomicWriter(layout.summary_file))
        writers[-1].write(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        for writer in writers:
            writer.close()
    except BaseException:
        for writer in writers:
            writer.discard()
        raise
    for writer in writers:  # only renames are left: a full disk cannot stop them half way
        writer.commit()
    if not unchanged:
        write_merge_state(layout, combined, totals.segments)
    return Merged(summary, unchanged)


def output_facts(layout: Layout) -> dict:
    """Size and time of each large output: one changed or removed by hand is written again."""
    facts = {}
    for path in (layout.manifest_file, layout.failures_file, layout.conversations_file):
        try:
            stat = path.stat()
            facts[path.name] = [stat.st_size, stat.st_mtime_ns]
        except FileNotFoundError:
            facts[path.name] = None
    return facts


def write_merge_state(layout: Layout, combined: str, segments: dict) -> None:
    """What the next merge compares with; the plan's segments by shard, for export's units."""
    plan = layout.plan_file.stat()
    state = {"version": MERGE_STATE_VERSION, "combined": combined, "outputs": output_facts(layout)}
    state.update(plan=[plan.st_size, plan.st_mtime_ns], segments=segments)
    try:
        write_json_atomic(layout.merge_state, state)
    except OSError as exc:  # the outputs are whole; the state left as it was makes the next merge write them
        if not is_disk_full(exc):
            raise


def planned_segments(layout: Layout) -> dict[str, int] | None:
    """{shard: planned segments} as the last merge counted them, or None when the plan changed since."""
    state = read_json(layout.merge_state)
    if not isinstance(state, dict) or state.get("version") != MERGE_STATE_VERSION:
        return None
    try:
        plan = layout.plan_file.stat()
    except FileNotFoundError:
        return None
    return state.get("segments") if state.get("plan") == [plan.st_size, plan.st_mtime_ns] else None


def refresh_parts(layout: Layout, check_audio: bool) -> Totals:
    """Remake the part of each shard whose files changed since its part was made; the sum of every
    part's counts, and a digest of everything the outputs would hold."""
    totals = Totals()
    plan = read_json(layout.plan_file) or {}
    totals.digest.update(orjson.dumps([shard_part.PART_VERSION, check_audio, plan.get("estimated_hours")]))
    for row in iter_jsonl(layout.skipped_file):
        totals.digest.update(orjson.dumps(row))
        totals.skipped_turns += 1
        if str(row.get("reason")).startswith("language "):
            totals.skipped_languages[row.get("language")] += 1
    listing = WorkListing(layout)
    shards = layout.shard_names()
    for shard in shards:
        facts, racy = shard_part.facts(layout, shard, listing, check_audio)
        header = shard_part.current_header(layout, shard, facts)
        if header is None:
            part = shard_part.build(layout, shard, listing, facts, racy)
            path = layout.merge_part(shard)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, part.to_bytes())
            header = part.header
        counts = Counts.from_json(header["counts"])
        totals.counts.add(counts)
        totals.segments[shard] = counts.segments
        totals.digest.update(f"{shard} {header['digest']}".encode())
    remove_other_parts(layout, set(shards))
    return totals


def remove_other_parts(layout: Layout, shards: set[str]) -> None:
    """Parts of shards the plan no longer holds, and what a killed merge left (.NAME.tmpPID)."""
    try:
        entries = list(os.scandir(layout.merge_dir))
    except FileNotFoundError:
        return
    for folder in [entry.path for entry in entries if entry.is_dir()]:
        entries += os.scandir(folder)
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            pid = name.rpartition(".tmp")[2]
            if pid.isdigit() and not _alive(int(pid)):
                os.unlink(entry.path)
        elif name.endswith(".part") and name[: -len(".part")] not in shards:
            os.unlink(entry.path)


def remove_stale_temporaries(layout: Layout) -> None:
    """Delete what a killed merge (or config write) left in the output root, e.g. .manifest.jsonl.tmp4242.

    A SIGKILL before the rename leaves it for good, and nothing else looks there. The pid in the name
    tells whether its writer is still at work (a merge started by hand beside this one).
    """
    for path in layout.root.glob(".*.tmp*"):
        pid = path.name.rpartition(".tmp")[2]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def write_outputs(layout: Layout, manifest, failures, conversations) -> None:
    """Stream the skipped turns, then every shard's part, into the outputs, one part in memory at a time.

    A conversation longer than a shard has its turns in consecutive shards and its record in the
    shard of its last turn: its audio so far is carried from part to part ({conversation: {turn:
    audio}}), and its record made again where it ends."""
    for row in iter_jsonl(layout.skipped_file):
        failures.write(orjson.dumps(row) + b"\n")
    conversations.write(b"[")
    first = True
    carried: dict = {}
    for shard in layout.shard_names():
        part = shard_part.read_part(layout, shard)
        manifest.write(part.manifest)
        failures.write(part.failures)
        records = part.conversations
        head = part.header["head"]
        if head and head["cid"] in carried:
            turns = {**carried.pop(head["cid"]), **shard_part.turn_keys(head["turns"])}
            record = shard_part.with_audio(shard_part.first_record(layout, shard), turns)
            records = b",\n" + orjson.dumps(record) + bytes(records[head["length"] :])
        if records:
            conversations.write(records[1:] if first else records)  # the first record has no comma
            first = False
        for cid, turns in part.header["carry"].items():
            carried.setdefault(cid, {}).update(shard_part.turn_keys(turns))
    conversations.write(b"\n]\n")


def make_summary(layout: Layout, t: Totals, run_id, started: float | None, log_dir: str | None = None) -> dict:
    plan = read_json(layout.plan_file) or {}
    c = t.counts
    run_utterances = c.runs.get(run_id, 0) if run_id else 0
    run_seconds = c.run_seconds.get(run_id, 0.0) if run_id else 0.0
    wall = time.time() - started if started else None
    rate = run_seconds / wall if wall else None
    return {
        "conversations": c.conversations,
        "segments": c.segments,
        "done": c.done,
        "failed": c.failed,
        "pending": c.pending,
        "dropped": c.dropped,
        "skipped_turns": t.skipped_turns,
        "skipped_languages": dict(t.skipped_languages.most_common()),
        "audio_seconds": round(c.audio_seconds, 3),
        "audio_hours": round(c.audio_seconds / 3600, 4),
        "backends": sorted(b for b in c.backends if b),
        "estimated_hours": plan.get("estimated_hours"),
        "complete": c.failed == 0 and c.pending == 0,
        "quality": c.quality.summary(),
        "this_run": {
            "utterances": run_utterances,
            "audio_seconds": round(run_seconds, 3),
            "wall_seconds": round(wall, 3) if wall else None,
            "audio_seconds_per_second": round(rate, 4) if rate else None,
            "real_time_factor": round(wall / run_seconds, 4) if wall and run_seconds else None,
            "log_dir": os.path.abspath(log_dir) if log_dir else None,
        },
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def summary_text(s: dict, failures: str = "failures.jsonl") -> str:
    """The closing summary; `failures`: where failures.jsonl is, for the line on refused takes."""
    run = s["this_run"]
    lines = [
        f"conversations {s['conversations']}, segments {s['segments']}: {s['done']} done, {s['failed']} failed, "
        f"{s['pending']} pending; {plural(s['skipped_turns'], 'turn')} skipped ({skipped_text(s)})",
        f"audio {s['audio_hours']:.3f} h in all; this run spoke {plural(run['utterances'], 'utterance')}, "
        f"{run['audio_seconds']:.1f} s of audio",
    ]
    if run["wall_seconds"]:
        factor = run["real_time_factor"]
        lines.append(
            f"wall time {run['wall_seconds']:.1f} s, {run['audio_seconds_per_second'] or 0:.2f} audio s/s, "
            f"real-time factor {factor if factor is not None else 'n/a'}"
        )
    quality = s.get("quality") or {}
    if quality.get("gated") or quality.get("failed_by_reason") or quality.get("refused"):
        wer = quality["wer"]
        heard = (
            f"ASR WER mean {wer['mean']:.3f}, p90 {wer['p90']:.3f} over {wer['scored']}"
            if wer["scored"]
            else "no ASR scores"
        )
        lines.append(
            f"quality gate: {quality['gated']} passed, {quality['respoken']} of them re-spoken; {heard}; "
            f"failed by reason {quality['failed_by_reason'] or 'none'} (python -m convtts.results.report for a page)"
        )
    if quality.get("refused"):
        lines.append(refused_text(quality["refused"], failures))
    return "\n".join(lines)


def skipped_text(s: dict) -> str:
    """Why turns were skipped: `nothing speakable`, or `118 in zh, which the voice does not speak; ...`."""
    languages = s.get("skipped_languages") or {}
    if not languages:
        return "nothing speakable"
    told = ", ".join(f"{n} in {language}" for language, n in languages.items())
    rest = s["skipped_turns"] - sum(languages.values())
    return f"{told}: the voice does not speak it" + (f"; {rest} with nothing speakable" if rest else "")


def refused_text(refused: dict, where: str) -> str:
    """The closing line on utterances whose every take the gate refused, by what became of them
    (validate.on_fail), e.g. `the quality gate refused every take of 3 utterances (silence: 1,
    wer: 2): 3 kept, status gate-refused-kept in manifest.jsonl; see .../failures.jsonl ...`."""
    counts = ", ".join(f"{check}: {n}" for check, n in sorted(refused["by_check"].items()))
    fates = {
        "kept": "kept, status gate-refused-kept in manifest.jsonl",
        "dropped": "dropped, not spoken",
        "failed": "failed: a rerun speaks them again",
    }
    told = "; ".join(f"{refused[fate]} {text}" for fate, text in fates.items() if refused.get(fate))
    count = refused["utterances"]
    return (
        f"the quality gate refused every take of {count} utterance{'s' * (count != 1)} ({counts}): {told}; "
        f"see {where} (each one's check, figure and scores)"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="merge shard results into manifest.jsonl, failures.jsonl, conversations.json, summary.json"
    )
    p.add_argument("output_dir")
    p.add_argument("--run-id")
    p.add_argument("--started", type=float, help="epoch seconds the run started, for wall time and rate")
    p.add_argument("--log-dir", help="the run's log folder, named in summary.json (this_run.log_dir)")
    p.add_argument(
        "--no-audio-check",
        action="store_true",
        help="count each manifest row without opening its audio (saves 0.2 to 0.35 ms of CPU a "
        "file, most of a large merge; for benchmarks, or audio checked otherwise)",
    )
    p.add_argument(
        "--force", action="store_true", help="write the outputs even when nothing changed since the last merge"
    )
    args = p.parse_args(argv)
    layout = Layout(args.output_dir)
    if not layout.plan_file.is_file():
        print(f"error: no plan in {layout.plan_dir}", file=sys.stderr)
        return 2
    try:
        merged = merge(layout, args.run_id, args.started, not args.no_audio_check, args.log_dir, args.force)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        print(
            f"error: {disk_full_text(exc)}; the previous results in {layout.root} are left as they were",
            file=sys.stderr,
        )
        return EXIT_DISK_FULL
    if merged.unchanged:
        print(
            f"nothing changed since the last merge: manifest.jsonl, failures.jsonl and conversations.json in "
            f"{layout.root} are left as they were"
        )
    print(summary_text(merged.summary, str(layout.failures_file)))
    return EXIT_OK if merged.summary["complete"] else EXIT_FAILURES


if __name__ == "__main__":
    sys.exit(main())
