"""Merge the per-shard work files into the outputs people load: manifest, failures, conversations, summary."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import orjson

from convtts import EXIT_DISK_FULL, EXIT_FAILURES, EXIT_OK
from convtts.results.report import QualityTally
from convtts.state.layout import Layout, WorkListing
from convtts.state.shardio import (
    DROPPED,
    KEPT,
    disk_full_text,
    is_disk_full,
    load_done,
    load_failures,
    read_json,
    read_jsonl,
)
from convtts.words import plural


@dataclass
class Totals:
    conversations: int = 0
    segments: int = 0
    done: int = 0
    failed: int = 0
    pending: int = 0
    dropped: int = 0  # every take refused, and validate.on_fail: drop (settled, not spoken)
    skipped_turns: int = 0
    skipped_languages: Counter = field(default_factory=Counter)  # of those, turns the voice does not speak
    audio_seconds: float = 0.0
    run_utterances: int = 0
    run_audio_seconds: float = 0.0
    backends: set = field(default_factory=set)
    quality: QualityTally = field(default_factory=QualityTally)


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
) -> dict:
    """Write the outputs whole or not at all: a failure (a full disk) leaves the previous ones as they were.

    `check_audio` False counts each row without opening its audio (--no-audio-check); `log_dir`, the
    run's log folder, is named in the summary."""
    remove_stale_temporaries(layout)
    writers: list[AtomicWriter] = []
    try:
        for path in (layout.manifest_file, layout.failures_file, layout.conversations_file):
            writers.append(AtomicWriter(path))
        summary = make_summary(layout, write_outputs(layout, run_id, check_audio, *writers), started, log_dir)
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
    return summary


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


def write_outputs(layout: Layout, run_id, check_audio: bool, manifest, failures, conversations) -> Totals:
    totals = Totals()
    listing = WorkListing(layout)
    conversations.write(b"[")
    first = True
    for row in read_jsonl(layout.skipped_file):
        failures.write(orjson.dumps(row) + b"\n")
        totals.skipped_turns += 1
        if str(row.get("reason")).startswith("language "):
            totals.skipped_languages[row.get("language")] += 1
    # {conversation: {turn: audio}} of the conversations whose record is still to come: one longer
    # than a shard has its turns in consecutive shards and its record in the shard of its last turn.
    audio_by_turn: dict = {}
    for shard in layout.shard_names():
        done = load_done(layout, shard, paths=listing.manifests(shard), check_audio=check_audio)
        failed = load_failures(layout, shard, listing.failure_files(shard))
        for cid, turns in merge_shard(layout, shard, (done, failed), run_id, totals, manifest, failures).items():
            audio_by_turn.setdefault(cid, {}).update(turns)
        for item in read_jsonl(layout.shard_conversations(shard)):
            record = with_audio(item, audio_by_turn.pop(item["conversation_id"], {}))
            conversations.write((b"" if first else b",") + b"\n" + orjson.dumps(record))
            first = False
            totals.conversations += 1
    conversations.write(b"\n]\n")
    return totals


def merge_shard(layout, shard, results, run_id, totals: Totals, manifest, failures) -> dict:
    """Write one shard's rows in plan order, from its (done, failed) rows by id; return
    {conversation: {turn: {"audio": [paths], "language": its language}}}."""
    done, failed = results
    audio_by_turn: dict = {}
    for segment in read_jsonl(layout.shard_file(shard)):
        uid = segment["id"]
        totals.segments += 1
        if uid in done and done[uid].get("status") == DROPPED:
            failures.write(orjson.dumps(done[uid]) + b"\n")
            totals.dropped += 1
            totals.quality.add_refused(done[uid])
        elif uid in done:
            row = with_source_text(done[uid], segment)
            if row.get("status") == KEPT:  # written, and listed with the refusals too
                failures.write(orjson.dumps(kept_failure(row)) + b"\n")
            manifest.write(orjson.dumps(row) + b"\n")
            totals.done += 1
            totals.audio_seconds += row["duration"]
            totals.backends.add(row.get("backend"))
            totals.quality.add_row(row)
            if run_id and row.get("run") == run_id:
                totals.run_utterances += 1
                totals.run_audio_seconds += row["duration"]
            turns = audio_by_turn.setdefault(segment["conversation_id"], {})
            spoken = turns.setdefault(segment["turn"], {"audio": [], "language": segment.get("language")})
            spoken["audio"].append(row["audio"])
        elif uid in failed:
            failures.write(orjson.dumps(failed[uid]) + b"\n")
            totals.failed += 1
            totals.quality.add_failure(failed[uid])
        else:
            pending = {
                k: segment.get(k) for k in ("id", "conversation_id", "turn", "segment", "role", "speaker", "text")
            }
            pending.update(status="pending", reason="not synthesised yet (the run stopped before it)")
            failures.write(orjson.dumps(pending) + b"\n")
            totals.pending += 1
    return audio_by_turn


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


def make_summary(layout: Layout, t: Totals, started: float | None, log_dir: str | None = None) -> dict:
    plan = read_json(layout.plan_file) or {}
    wall = time.time() - started if started else None
    rate = t.run_audio_seconds / wall if wall else None
    return {
        "conversations": t.conversations,
        "segments": t.segments,
        "done": t.done,
        "failed": t.failed,
        "pending": t.pending,
        "dropped": t.dropped,
        "skipped_turns": t.skipped_turns,
        "skipped_languages": dict(t.skipped_languages.most_common()),
        "audio_seconds": round(t.audio_seconds, 3),
        "audio_hours": round(t.audio_seconds / 3600, 4),
        "backends": sorted(b for b in t.backends if b),
        "estimated_hours": plan.get("estimated_hours"),
        "complete": t.failed == 0 and t.pending == 0,
        "quality": t.quality.summary(),
        "this_run": {
            "utterances": t.run_utterances,
            "audio_seconds": round(t.run_audio_seconds, 3),
            "wall_seconds": round(wall, 3) if wall else None,
            "audio_seconds_per_second": round(rate, 4) if rate else None,
            "real_time_factor": round(wall / t.run_audio_seconds, 4) if wall and t.run_audio_seconds else None,
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
    args = p.parse_args(argv)
    layout = Layout(args.output_dir)
    if not layout.plan_file.is_file():
        print(f"error: no plan in {layout.plan_dir}", file=sys.stderr)
        return 2
    try:
        summary = merge(layout, args.run_id, args.started, not args.no_audio_check, args.log_dir)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        print(
            f"error: {disk_full_text(exc)}; the previous results in {layout.root} are left as they were",
            file=sys.stderr,
        )
        return EXIT_DISK_FULL
    print(summary_text(summary, str(layout.failures_file)))
    return EXIT_OK if summary["complete"] else EXIT_FAILURES


if __name__ == "__main__":
    sys.exit(main())
