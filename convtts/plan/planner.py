"""Make the plan: the input read for ids (plan/ids.py) and the chosen records planned (plan/batches.py),
their segments packed into shard files, the plan swapped in whole."""

from __future__ import annotations

import logging
import os
import shutil
import time
from array import array
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import orjson

from convtts.config import Config
from convtts.counts import plural
from convtts.language import LANGUAGES
from convtts.plan.batches import Tally, planned
from convtts.plan.freshness import (
    PLAN_VERSION,
    content_digest,
    fingerprint,
    input_info,
    plan_settings,
    rules_digest,
)
from convtts.plan.ids import base_id, select, unique_ids
from convtts.plan.reader import InputError, read_spans, records
from convtts.speak import configs_speaking, voice_languages
from convtts.state.layout import FAN_OUT_SHARDS, Layout, shard_folder, shard_name

log = logging.getLogger(__name__)

PROGRESS_EVERY = 100_000


# --- writing the plan ---------------------------------------------------------------------------


class ShardWriter:
    """Packs conversations, in order, into shards of about `target` segments: whole when they fit in
    one, else cut between turns across consecutive shards, the record in the shard of its last turn."""

    def __init__(self, layout: Layout, target: int):
        self.layout, self.target = layout, target
        self.names: list[str] = []
        self.sizes: list[int] = []  # segments of each shard, for plan.json: a slot starts from them
        self.count = 0
        self.segments_fh = self.records_fh = None

    def add(self, segments: int, segment_lines: bytes, conversation_line: bytes, turn_sizes: list[int]) -> None:
        """`turn_sizes`: the segments of each spoken turn, in order (they add up to `segments`)."""
        # A conversation that would overfill a started shard opens the next one; one with no
        # segments rides along so that it still reaches the final conversations file. One longer
        # than a shard would leave every slot but one idle while it is spoken: its turns spread.
        if segments <= self.target or len(turn_sizes) < 2:
            self._make_room(segments)
            self.segments_fh.write(segment_lines)
            self._wrote(segments)
        else:
            lines = segment_lines.splitlines(keepends=True)
            start = 0
            for size in turn_sizes:
                self._make_room(size)
                self.segments_fh.write(b"".join(lines[start : start + size]))
                self._wrote(size)
                start += size
        self.records_fh.write(conversation_line)

    def _wrote(self, segments: int) -> None:
        self.count += segments
        self.sizes[-1] = self.count

    def _make_room(self, segments: int) -> None:
        if self.segments_fh is None or (self.count and self.count + segments > self.target):
            self._next()

    def _next(self) -> None:
        self.close()
        name = shard_name(len(self.names))
        self.names.append(name)
        self.sizes.append(0)
        self.segments_fh = open(self.layout.shard_file(name), "wb")
        self.records_fh = open(self.layout.shard_conversations(name), "wb")
        self.count = 0

    def close(self) -> None:
        for fh in (self.segments_fh, self.records_fh):
            if fh is not None:
                fh.close()


def make_plan(
    input_path: str | Path,
    layout: Layout,
    config: Config,
    before_install: Callable[[Layout], None] | None = None,
    workers: int | None = None,
) -> dict:
    """Build the plan in a staging directory and swap it in whole; InputError leaves the old one."""
    started = time.monotonic()
    info = input_info(input_path)
    log.info("reading %s (%.1f MB)", info["path"], info["size"] / 1e6)
    layout.root.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(layout)
    staging = Layout(layout.root / f"{_STAGING}{os.getpid()}")
    staging.shards_dir.mkdir(parents=True)
    try:
        with open(staging.skipped_file, "wb") as skipped:
            ids, spans, counts = _index(input_path, skipped)
            chosen = select(ids, config.select)
            log.info("selected %s of %s", f"{len(chosen):,}", plural(len(ids), "conversation"))
            writer = ShardWriter(staging, config.shards.segments_per_shard)
            try:
                written = _write_shards(
                    input_path, ids, spans, chosen, config, writer, skipped, workers or min(os.cpu_count() or 1, 8)
                )
                counts = {**counts, **written}
            finally:
                writer.close()
        fan_out(staging, writer.names, layout)
        digest = content_digest(input_path)  # before the check: the hash is of the bytes planned
        if input_info(input_path) != info:
            raise InputError(f"{input_path} changed while the plan was being made; run again")
        info["sha256"] = digest
        plan = _summary(fingerprint(input_path, config), info, counts, writer, config)
        staging.plan_file.write_bytes(orjson.dumps(plan, option=orjson.OPT_INDENT_2) + b"\n")
        if before_install is not None:  # it sees the new plan (staging) beside the old one; it may refuse it
            before_install(staging)
        _install(staging.plan_dir, layout.plan_dir)
    finally:
        shutil.rmtree(staging.root, ignore_errors=True)
    log.info(
        "plan made in %.1f s: %s in %s",
        time.monotonic() - started,
        plural(plan["segments"], "segment"),
        plural(len(plan["shards"]), "shard"),
    )
    return plan


def fan_out(staging: Layout, names: list[str], layout: Layout) -> None:
    """A plan of more than FAN_OUT_SHARDS shards keeps them a thousand a folder (Layout.fanned), as
    its work and audio will be; where the output already holds work, its layout is kept."""
    fanned = work_fanned(layout)
    if not (fanned if fanned is not None else len(names) > FAN_OUT_SHARDS):
        return
    for name in names:
        folder = staging.shards_dir / shard_folder(name)
        folder.mkdir(exist_ok=True)
        for file in (f"{name}.jsonl", f"{name}.conversations.jsonl"):
            os.replace(staging.shards_dir / file, folder / file)
    log.info("%s: a thousand a folder", plural(len(names), "shard"))


def work_fanned(layout: Layout) -> bool | None:
    """Whether the output's work is kept a thousand shards a folder (True), in one folder (False,
    as every output made before was), or there is none (None)."""
    for root in (layout.work_dir, layout.audio_root):
        try:
            entries = list(os.scandir(root))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.name.startswith("shard-"):
                return False
            if entry.name.isdigit() and entry.is_dir():
                return True
    return None


def _index(path, skipped) -> tuple[list[str], tuple[array, array], Counter]:
    """First pass: every usable record's id and byte span; the others go to skipped.jsonl."""
    bases, offsets, lengths = [], array("q"), array("q")
    records_read = 0
    for index, offset, length, value, problem in records(path):
        records_read += 1
        if problem is None:
            bases.append(base_id(value))
            offsets.append(offset)
            lengths.append(length)
        else:
            source = value.get("id") if isinstance(value, dict) else None
            skipped.write(
                orjson.dumps(
                    {
                        "id": f"record-{index}",
                        "conversation_id": None,
                        "source_id": source,
                        "record": index,
                        "turn": None,
                        "role": None,
                        "status": "skipped",
                        "reason": problem,
                    }
                )
                + b"\n"
            )
        if records_read % PROGRESS_EVERY == 0:
            log.info("read %d records", records_read)
    counts = Counter(records=records_read, skipped_records=records_read - len(bases))
    return unique_ids(bases), (offsets, lengths), counts


def _write_shards(path, ids, spans, chosen, config: Config, writer: ShardWriter, skipped, workers: int) -> dict:
    """Second pass: read only the chosen records, by their spans, and write their segments."""
    offsets, lengths = spans
    raws = read_spans(path, ((offsets[i], lengths[i]) for i in chosen))
    items = zip((ids[i] for i in chosen), raws)
    conversations = segments_total = 0
    tally = Tally()
    for segments, segment_lines, conversation_line, skipped_lines, one, turn_sizes in planned(
        items, config, len(chosen), workers
    ):
        writer.add(segments, segment_lines, conversation_line, turn_sizes)
        skipped.write(skipped_lines)
        conversations += 1
        segments_total += segments
        tally.add(one)
        if conversations % PROGRESS_EVERY == 0:
            log.info("planned %d/%d conversations, %d segments", conversations, len(chosen), segments_total)
    refuse_language(path, tally, config)
    if not segments_total:
        raise InputError(
            f"{path}: nothing to speak: {_none_of(conversations)} with speakable text "
            f"({plural(tally.skipped_turns, 'turn')} skipped: empty, only placeholders, code or links, "
            "or roles not in text.speak_roles)"
        )
    return {
        "conversations": conversations,
        "segments": segments_total,
        "turns": tally.turns,
        "words": tally.words,
        "skipped_turns": tally.skipped_turns,
        "seconds": tally.seconds,
        "languages": dict(tally.languages.most_common()),
        "skipped_languages": dict(tally.unspoken.most_common()),
    }


class LanguageRefused(InputError):
    """Most of the input is in a language the configured voice does not speak."""


def refuse_language(path, tally: Tally, config: Config) -> None:
    """Refuse an input whose turns are mostly in languages the voice does not speak (one voice for
    the wrong language is a misconfiguration, not a job); a few such turns are skipped."""
    unspoken = sum(tally.unspoken.values())
    if unspoken * 2 <= unspoken + tally.turns:
        return
    language, turns = tally.unspoken.most_common(1)[0]
    speaks = ", ".join(sorted(voice_languages(config) or ()))
    others = configs_speaking(language)
    raise LanguageRefused(
        f"{path}: {turns:,} of {plural(unspoken + tally.turns, 'turn')} are in {language_name(language)} ({language}), "
        f"and the voice (tts.backend {config.tts.backend}) speaks {speaks} only; "
        + (f"{_listed(others)} speak {language}" if others else f"no shipped config speaks {language}")
        + " (docs/languages.md)"
    )


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def language_name(code: str) -> str:
    names = {c: name for name, c in LANGUAGES.items()}
    names.update(yue="Cantonese", th="Thai")
    return names.get(code, code)


def _none_of(conversations: int) -> str:
    if conversations == 1:
        return "the one selected conversation has no turn"
    return f"none of the {conversations:,} selected conversations has a turn"


def _summary(fp: str, info: dict, counts: dict, shards: ShardWriter, config: Config) -> dict:
    return {
        "version": PLAN_VERSION,
        "fingerprint": fp,
        "rules": rules_digest(config),  # the text rules' digest, for a refusal to name
        "input": info,
        "records": counts["records"],
        "skipped_records": counts["skipped_records"],
        "conversations": counts["conversations"],
        "turns": counts["turns"],
        "skipped_turns": counts["skipped_turns"],
        "segments": counts["segments"],
        "words": counts["words"],
        "estimated_hours": round(counts["seconds"] / 3600, 3),
        "estimated_seconds": round(counts["seconds"], 1),  # each language at its rate (text.*_per_minute)
        "languages": counts["languages"],  # turns spoken, by language
        "skipped_languages": counts["skipped_languages"],  # turns skipped: the voice does not speak them
        "settings": plan_settings(config),  # what a refused rerun names the changes against
        "shards": shards.names,
        "shard_segments": shards.sizes,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# Staging and retired plans live beside plan/ (one file system, so renames are atomic).
_STAGING, _RETIRED = ".plan-new-", ".plan-old-"


def _install(new: Path, current: Path) -> None:
    """Rename the old plan away, the new one in, then delete the old: a crash leaves a whole plan or none."""
    retired = current.with_name(f"{_RETIRED}{os.getpid()}")
    if current.exists():
        os.rename(current, retired)
    os.rename(new, current)
    shutil.rmtree(retired, ignore_errors=True)


def _remove_leftovers(layout: Layout) -> None:
    for prefix in (_STAGING, _RETIRED):
        for path in layout.root.glob(f"{prefix}*"):
            shutil.rmtree(path, ignore_errors=True)
