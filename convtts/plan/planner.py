"""Make the plan: stable ids, a seeded selection, cleaned segments with voices, packed into shard files."""

from __future__ import annotations

import hashlib
import heapq
import logging
import multiprocessing
import os
import re
import shutil
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import orjson

from convtts.config import Config, SelectConfig
from convtts.counts import plural
from convtts.language import LANGUAGES
from convtts.plan.conversation import plan_conversation
from convtts.plan.freshness import (
    PLAN_VERSION,
    content_digest,
    fingerprint,
    input_info,
    plan_settings,
    rules_digest,
)
from convtts.plan.reader import InputError, read_spans, records
from convtts.plan.voices import Casting, casting_for
from convtts.speak import configs_speaking, voice_languages
from convtts.state.layout import FAN_OUT_SHARDS, Layout, shard_folder, shard_name

log = logging.getLogger(__name__)

PROGRESS_EVERY = 100_000
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


# --- planning in batches, in worker processes when there is enough work ---------------------------

PARALLEL_MIN = 20_000  # conversations below which worker processes cost more than they save
BATCH = 500  # conversations sent to a worker at a time


def plan_batch(
    batch: list[tuple[str, bytes]], config: Config, casting: Casting, speaks: frozenset[str] | None = None
) -> list[tuple]:
    """Plan raw records: (segments, segment lines, conversation line, skipped lines, counts_of(...),
    segments of each spoken turn)."""
    out = []
    for cid, raw in batch:
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"record {cid} no longer parses ({exc.msg}): did the input change?") from None
        segments, skipped = plan_conversation(cid, record, config, casting, speaks)
        # The record as it came, byte for byte, when it fits on one line (compact arrays, JSON lines).
        raw = raw.strip()
        body = raw if b"\n" not in raw and b"\r" not in raw else orjson.dumps(record)
        out.append(
            (
                len(segments),
                b"".join(orjson.dumps(s) + b"\n" for s in segments),
                b'{"conversation_id":' + orjson.dumps(cid) + b',"record":' + body + b"}\n",
                b"".join(orjson.dumps(s) + b"\n" for s in skipped),
                counts_of(segments, skipped, config),
                list(Counter(s["turn"] for s in segments).values()),
            )
        )
    return out


def counts_of(segments: list[dict], skipped: list[dict], config: Config) -> tuple:
    """One conversation's counts, as cheap to send back from a worker as ints: (turns, words,
    estimated seconds, skipped turns, ((language, turns spoken), ...), ((language, turns skipped
    because the voice does not speak it), ...))."""
    turns, words = {}, 0
    for s in segments:
        turns[s["turn"]] = s["language"]
        words += s["words"]
    languages = set(turns.values())
    if len(languages) == 1:  # nearly always: one rate for the whole conversation
        (language,) = languages
        seconds, spoken = config.text.seconds(words, language), ((language, len(turns)),)
    else:
        units = Counter()
        for s in segments:
            units[s["language"]] += s["words"]
        seconds = sum(config.text.seconds(n, language) for language, n in units.items())
        spoken = tuple(Counter(turns.values()).items())
    unspoken = [s["language"] for s in skipped if s["reason"].startswith("language ")]
    return len(turns), words, seconds, len(skipped), spoken, tuple(Counter(unspoken).items()) if unspoken else ()


class Tally:
    """What a plan counts: turns spoken and skipped, words, estimated seconds, turns by language."""

    def __init__(self):
        self.turns = self.words = self.skipped_turns = 0
        self.seconds = 0.0
        self.languages: Counter = Counter()  # turns spoken, by language
        self.unspoken: Counter = Counter()  # turns skipped because the voice does not speak their language

    def add(self, counts: tuple) -> None:
        turns, words, seconds, skipped, languages, unspoken = counts
        self.turns += turns
        self.words += words
        self.seconds += seconds
        self.skipped_turns += skipped
        for language, n in languages:
            self.languages[language] += n
        for language, n in unspoken:
            self.unspoken[language] += n


def _batches(items, size: int):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


_worker_config: tuple[Config, Casting, frozenset[str] | None] | None = None


def _init_worker(config: Config, casting: Casting, speaks: frozenset[str] | None) -> None:
    global _worker_config
    _worker_config = (config, casting, speaks)


def _plan_in_worker(batch):
    return plan_batch(batch, *_worker_config)


def _planned(items, config: Config, total: int, workers: int):
    """plan_batch over all items, in order; a bounded number of batches in flight keeps memory flat."""
    casting = casting_for(config)
    speaks = voice_languages(config)
    if total < PARALLEL_MIN or workers < 2:
        for batch in _batches(items, BATCH):
            yield from plan_batch(batch, config, casting, speaks)
        return
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=(config, casting, speaks)) as pool:
        pending: deque = deque()
        for batch in _batches(items, BATCH):
            pending.append(pool.apply_async(_plan_in_worker, (batch,)))
            if len(pending) > 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()


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
    for segments, segment_lines, conversation_line, skipped_lines, one, turn_sizes in _planned(
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
