"""Conversations planned in batches, in worker processes when there is enough work: each record
becomes its segment lines, its conversation line, its skipped turns and its counts, in input order.
Apart from planner.py, which feeds this the chosen records and writes what comes back into shards.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter, deque

import orjson

from convtts.config import Config
from convtts.plan.conversation import plan_conversation
from convtts.plan.reader import InputError
from convtts.plan.voices import Casting, casting_for
from convtts.speak import voice_languages

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


def planned(items, config: Config, total: int, workers: int):
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
