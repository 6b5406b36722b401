"""A worker's batched path: utterances handed to the backend's synthesize_many, results written as each finishes.

Each utterance keeps what the one-at-a-time path gives it: its own seed, manifest row, attempt
count and failure record. A failed utterance is retried in a later batch up to workers.max_attempts;
a take the quality gate refuses is spoken again with its next seed, up to validate.max_respeaks;
a CUDA out-of-memory halves the backend's rows and retries what was in flight; an utterance that
killed a worker before is spoken alone, so it cannot take a batch down with it again.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from convtts.shardio import is_disk_full

log = logging.getLogger(__name__)


@dataclass
class Attempt:
    segment: dict
    attempt: int  # the number of the attempt under way
    errors: list[str] = field(default_factory=list)
    started: float = 0.0
    seed: int = 0
    refused: list = field(default_factory=list)  # the quality gate's reason for each refused take


def can_batch(backend) -> bool:
    return getattr(backend, "batch_rows", 1) > 1 and hasattr(backend, "synthesize_many")


def speak_batched(worker, shard: str, segments: list[dict], crashes: dict[str, int]) -> None:
    """Speak `segments` of `shard`; rebuilds (every N, memory limits) happen between batches."""
    alone = [s for s in segments if crashes.get(s["id"], 0)]
    queue = deque(Attempt(s, 1) for s in segments if not crashes.get(s["id"], 0))
    for segment in alone:
        worker.speak(shard, segment, crashes[segment["id"]])
    while queue:
        reason = worker.rebuild_reason()
        if reason:
            worker.build(reason)
        if not can_batch(worker.backend):  # a rebuild can land on a backend without batching
            while queue:
                worker.speak(shard, queue.popleft().segment, 0)
            return
        run_batch(worker, shard, queue)


def run_batch(worker, shard: str, queue: deque) -> None:
    """Feed the backend from `queue` until it is empty or a rebuild is due; write every result."""
    from convtts.backends.cosyvoice import OutOfMemory
    from convtts.quality import take_seed

    seed_base = worker.config.workers.seed
    in_flight: dict[str, Attempt] = {}

    def feed():
        while queue and not worker.rebuild_reason():
            item = queue.popleft()
            uid = item.segment["id"]
            in_flight[uid] = item
            item.started, item.seed = time.time(), take_seed(seed_base, uid, len(item.refused))
            worker.send("start", uid)
            yield uid, item.segment["text"], item.segment["speaker"], item.seed

    try:
        for uid, result in worker.backend.synthesize_many(feed()):
            finish(worker, shard, in_flight.pop(uid), result, queue)
    except OutOfMemory as exc:
        rows = worker.backend.shrink_batch()
        log.warning("CUDA out of memory with %d utterances in flight; now %d rows", len(in_flight), rows)
        for item in in_flight.values():
            retry_or_fail(worker, shard, item, exc, queue)
    except Exception as exc:  # the batch as a whole broke: no single utterance is known to be at fault
        if is_disk_full(exc):
            raise
        log.warning("a batch failed (%s: %s); speaking its %d utterances one at a time", type(exc).__name__, exc, len(in_flight))
        for item in in_flight.values():
            worker.speak(shard, item.segment, item.attempt)  # this attempt counts, as a crash would


def finish(worker, shard: str, item: Attempt, result, queue: deque) -> None:
    from convtts.quality import QualityFailure
    from convtts.utterance import keep_audio, quality_failure_row, respeak

    if isinstance(result, BaseException):
        retry_or_fail(worker, shard, item, result, queue)
        return
    try:
        row = keep_audio(worker, shard, item.segment, result, item.attempt, item.seed, item.started, item.refused)
    except QualityFailure as bad:  # a new take (new seed) in a later batch, or the failure row
        if respeak(item.segment["id"], bad, item.refused, worker.config.validate.max_respeaks):
            queue.append(item)
        else:
            row = quality_failure_row(item.segment, worker, item.refused, item.attempt, item.errors)
            worker.record(shard, item.segment["id"], None, row)
        return
    except Exception as exc:  # this utterance's, as on the one-at-a-time path, unless the disk is full
        if is_disk_full(exc):
            raise
        retry_or_fail(worker, shard, item, exc, queue)
        return
    worker.record(shard, item.segment["id"], row, None)


def retry_or_fail(worker, shard: str, item: Attempt, exc: BaseException, queue: deque) -> None:
    """Another attempt in a later batch, or the failure row once attempts run out."""
    from convtts.utterance import failure_row, note_error

    uid = item.segment["id"]
    limit = worker.config.workers.max_attempts
    note_error(uid, item.attempt, limit, exc, item.errors)
    if item.attempt < limit:
        item.attempt += 1
        queue.append(item)
        return
    worker.record(shard, uid, None, failure_row(item.segment, worker, item.errors, limit))
