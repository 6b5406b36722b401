"""A worker's batched path: utterances handed to the backend's synthesize_many, results written as each finishes.

The batch is fed from the worker's queue, which its slot tops up before it runs dry (the worker's
refill), so rows stay full across pieces and shards; a batch ends when the queue is empty, a
rebuild is due, its rows may grow again, or an utterance must be spoken alone. Each utterance keeps
what the one-at-a-time path gives it: its own seed, manifest row, attempt count and failure record.
A failed utterance is retried in a later batch up to workers.max_attempts;
a take the quality gate refuses is spoken again with its next seed, up to validate.max_respeaks
(finished takes are judged in groups that fill the recogniser's batch, validate.asr_batch takes or,
packed, windows, before any is written);
a CUDA out-of-memory halves the backend's rows and retries what was in flight, and the rows double
again after a stretch without one (GROW_AFTER); an utterance that
killed a worker before is spoken alone, so it cannot take a batch down with it again.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from convtts.counts import plural
from convtts.run.utterance import (
    Attempt,
    Context,
    Host,
    check_audio,
    failure_row,
    first_sentence,
    note_error,
    respeak,
    settle_refused,
    write_take,
)
from convtts.speak.base import FEED_WAIT, Backend, BatchedBackend, OutOfMemory, SynthesisError
from convtts.state.shardio import is_disk_full

log = logging.getLogger(__name__)


class BatchHost(Host, Protocol):
    """The worker as the batched path sees it: its queue, kept topped up by `refill`."""

    queue: deque  # Attempts to speak; the worker adds pieces and removes ids handed back
    alone: deque  # Attempts that killed a worker before: spoken one at a time, between batches
    holding: bool  # its first batch is to come: it takes its rows' worth of ids, with no refill beside them
    hold_release: float  # the share of those ids whose results come back before it takes more (workers.hold_release)
    regrowth: Regrowth  # when rows an out-of-memory halved double again: new at each model build

    def refill(self) -> None: ...
    def requeued(self, item: Attempt) -> None: ...


# How long rows an out-of-memory halved wait before they double again: this many turnovers of the
# rows (their count of utterances finished), doubled at each out-of-memory that followed a growth.
# The ids that ran out go back in line behind those queued, so the first turnover or so speaks them
# at the halved rows, and the rest show that what follows fits: ids go out longest first, so the
# texts after an out-of-memory are seldom longer. A growth ends the batch (a backend resizes its
# rows between batches) and its rows drain for about a turnover: a wait of four keeps that near a
# fifth of the time. Counted in the rows of the moment, not those the backend was built with, a
# wait takes about as long at any count: a worker cut to one row is back to 128 in seven steps,
# not after speaking 128 times four utterances one at a time.
GROW_AFTER = 4


@dataclass
class Regrowth:
    """A worker's rows since its backend's last out-of-memory: when they may double again (`due`)."""

    full: int = 0  # the backend's rows before its first out-of-memory (0: none yet)
    wait: int = 0  # utterances to finish without another before the rows double
    finished: int = 0  # utterances finished since the rows last changed
    backoff: int = 1  # doubled at each out-of-memory after a growth: the rows had grown too soon
    grown: bool = False  # the rows grew since the last out-of-memory

    def shrunk(self, before: int, after: int) -> None:
        self.full = self.full or before
        if self.grown:
            self.backoff *= 2
        self.grown = False
        self.restart(after)

    def grew(self, rows: int) -> None:
        self.grown = True
        self.restart(rows)

    def restart(self, rows: int) -> None:
        self.wait, self.finished = rows * GROW_AFTER * self.backoff, 0

    def due(self, rows: int) -> bool:
        return rows < self.full and self.finished >= self.wait


def can_batch(backend: Backend) -> bool:
    return isinstance(backend, BatchedBackend) and backend.batch_rows > 1


def growth_due(host: BatchHost) -> bool:
    backend = host.context.backend
    return isinstance(backend, BatchedBackend) and host.regrowth.due(backend.batch_rows)


def grow_rows(host: BatchHost) -> None:
    """Double the rows an out-of-memory cut, once the worker has finished its wait without another;
    between batches only: a backend resizes its rows (a KV cache) with none in flight."""
    if not growth_due(host):
        return
    before, regrowth = host.context.backend.batch_rows, host.regrowth
    rows = host.context.backend.grow_batch()
    log.info(
        "%s finished without running out of memory; rows %d -> %d of %d",
        plural(regrowth.finished, "utterance"),
        before,
        rows,
        regrowth.full,
    )
    regrowth.grew(rows)


def speak_batched(host: BatchHost) -> None:
    """Speak the host's queue until it runs dry; rebuilds (every N, memory limits) happen between batches."""
    while True:
        while host.alone:
            host.speak(host.alone.popleft())
        host.refill()
        if not host.queue:
            if host.alone:
                continue
            return
        reason = host.rebuild_reason()
        if reason:
            host.build(reason)
        grow_rows(host)
        if not can_batch(host.context.backend):  # a rebuild can land on a backend without batching, a cut on one row
            while host.queue and not growth_due(host):
                host.speak(host.queue.popleft())  # each keeps its attempts, errors and refused takes
            return
        run_batch(host, host.queue)


def run_batch(host: BatchHost, queue: deque) -> None:
    """Feed the backend from `queue` until it is empty, a rebuild is due or an utterance must go alone;
    gate and write every result."""
    from convtts.gate.quality import take_seed

    ctx = host.context
    in_flight: dict[str, Attempt] = {}
    held: list[HeldTake] = []  # takes the backend finished, waiting for the gate to judge them together
    first = first_batch(host, ctx.backend)

    def feed():
        nonlocal first
        while not host.rebuild_reason() and not host.alone and not growth_due(host):
            if first is not None and first.given >= first.rows:
                if first.back < first.release:
                    yield FEED_WAIT  # the engine steps on and asks again
                    continue
                first, host.holding = None, False  # released: the worker asks its slot for more again
            host.refill()  # new pieces join the queue while rows decode
            if not queue or host.alone:
                return
            item = queue.popleft()
            uid = item.segment["id"]
            in_flight[uid] = item
            item.started, item.seed = time.time(), take_seed(ctx.settings.seed, uid, len(item.refused))
            host.started(uid)
            if first is not None:
                first.given += 1
            yield uid, item.segment["text"], item.segment["speaker"], item.seed

    items = feed()
    if host.holding and first is None:  # a worker's first batch (workers.hold_first_batch): its rows' worth of
        # ids, the job's longest, and no row refilled while they decode (a refill's prefill and flow pass stop them)
        items = itertools.islice(items, ctx.backend.batch_rows)
    broken = None
    try:
        for uid, result in ctx.backend.synthesize_many(items):
            if first is not None:
                first.back += 1
            took(host, ctx, in_flight.pop(uid), result, held, queue)
            if gate_full(ctx, held):
                judge_and_write(host, ctx, held, queue)
    except Exception as exc:  # the batch as a whole broke (a full disk stops the worker)
        if is_disk_full(exc):
            raise
        broken = exc
    judge_and_write(host, ctx, held, queue)  # what finished before the feed ended or the batch broke
    host.holding = False
    if broken is not None:
        after_broken_batch(host, ctx, in_flight, broken, queue)


@dataclass
class FirstBatch:
    """A worker's first batch held with a release short of its end (workers.hold_release below 1): its
    `rows` ids go to the backend, then FEED_WAIT until `release` of their results are back."""

    rows: int
    release: int
    given: int = 0
    back: int = 0


def first_batch(host: BatchHost, backend) -> FirstBatch | None:
    """The held first batch released early, where the worker holds one and its backend can be told to wait;
    None for a hold to the batch's end (the feed then stops at its rows) or no hold."""
    if not host.holding or host.hold_release >= 1 or not backend.feed_may_wait:
        return None
    rows = backend.batch_rows
    return FirstBatch(rows, max(1, math.ceil(rows * host.hold_release)))


def after_broken_batch(host: BatchHost, ctx: Context, in_flight: dict, exc: Exception, queue: deque) -> None:
    """Out of memory: fewer rows, and what was in flight goes back in line; else each is spoken alone.
    One warning for the batch either way: each utterance's error goes to its own list (and so to its
    failure row, should its attempts run out), logged per id at debug level only."""
    if isinstance(exc, OutOfMemory):
        before, rows = ctx.backend.batch_rows, ctx.backend.shrink_batch()
        flight, now = plural(len(in_flight), "utterance"), plural(rows, "row")
        log.warning(
            "out of memory with %s in flight (%s); now %s, each tried again", flight, first_sentence(str(exc)), now
        )
        for item in in_flight.values():
            retry_or_fail(host, ctx, item, exc, queue, quiet=True)
        host.regrowth.shrunk(before, rows)  # after the failures its last attempts recorded: none counts
        return
    # no single utterance is known to be at fault
    log.warning(
        "a batch failed (%s: %s); speaking its %s one at a time",
        type(exc).__name__,
        exc,
        plural(len(in_flight), "utterance"),
    )
    for item in in_flight.values():
        note_error(item.segment["id"], item.attempt, ctx.settings.max_attempts, exc, item.errors, quiet=True)
        item.attempt += 1  # this attempt counts, as a crash would
        if item.attempt <= ctx.settings.max_attempts:
            host.speak(item)
        else:
            host.record(
                item.shard, item.segment["id"], None, failure_row(ctx, item.segment, item.errors, item.attempt - 1)
            )


@dataclass
class HeldTake:
    """A take the backend finished, its samples checked, not yet judged or written."""

    item: Attempt
    audio: np.ndarray
    seconds: float  # synthesis time: from the feed handing it over to the backend's result


def gate_full(ctx: Context, held: list[HeldTake]) -> bool:
    """Whether the held takes are worth judging now: without a gate at once; else when they fill its
    recogniser's batch (Gate.batch_full): packing, asr_batch windows' worth of audio, not the engine's
    rows. A call's decoding steps run one after another whatever its rows, and a packed window
    decodes about ten times the tokens of one take, so fuller calls cost less a take: with the tiny
    Whisper on the CPU, 2.5 s takes, 16 windows a batch (bench/whisper_cost.py), 78 ms a take in
    calls of 16 takes, 28 in calls of 64 (the rows of a GPU worker), 19 in calls of 160 (16 full
    windows); 49 unpacked (noisy: shared cores; single-threaded under load 74, 41, 19 and 62). By audio, not a count
    of takes: takes of 30 words fill windows three
    times as fast as takes of 10. (Takes the ASR check will skip count too: an estimate.)"""
    if ctx.gate is None:
        return True
    return ctx.gate.batch_full([len(take.audio) / ctx.backend.sample_rate for take in held])


def took(host: BatchHost, ctx: Context, item: Attempt, result, held: list, queue: deque) -> None:
    """A result of the backend: an error is retried; audio that passes the sanity check waits for the gate."""
    if not isinstance(result, BaseException):
        try:
            check_audio(result)
        except SynthesisError as exc:
            result = exc
    if isinstance(result, BaseException):
        retry_or_fail(host, ctx, item, result, queue)
    else:
        held.append(HeldTake(item, result, time.time() - item.started))


def judge_and_write(host: BatchHost, ctx: Context, held: list[HeldTake], queue: deque) -> None:
    """Judge the held takes together (one recogniser call), then write or re-speak each; empties `held`."""
    from convtts.gate.quality import Take

    rate = ctx.backend.sample_rate
    takes = [
        Take(h.audio, rate, h.item.segment["text"], h.item.segment["id"], h.item.segment.get("language", ""))
        for h in held
    ]
    try:
        verdicts = ctx.gate.judge_many(takes) if ctx.gate is not None and takes else [None] * len(takes)
    except Exception as exc:  # the gate broke on these takes: an error of each, retried as any other
        verdicts = [exc] * len(takes)
    held_now = held[:]
    held.clear()  # before writing: a full disk below leaves nothing held twice
    for take, verdict in zip(held_now, verdicts):
        finish(host, ctx, take, verdict, queue)


def finish(host: BatchHost, ctx: Context, take: HeldTake, verdict, queue: deque) -> None:
    """Write a take the gate passed (verdict: its scores, or None with the gate off); re-speak the
    others, or settle one whose re-speaks are spent by validate.on_fail (settle_refused)."""
    from convtts.gate.quality import QualityFailure

    item = take.item
    shard, uid = item.shard, item.segment["id"]
    refused = isinstance(verdict, QualityFailure)
    if refused and respeak(uid, verdict, item.refused, ctx.settings.max_respeaks):
        queue.append(item)  # a new take (new seed) in a later batch
        return
    made = (item.attempt, item.seed, take.seconds)
    try:
        if refused:
            row, failure = settle_refused(ctx, shard, item.segment, take.audio, made, item.refused, item.errors)
        elif isinstance(verdict, BaseException):  # the recogniser failed on this take
            raise verdict
        else:
            row, failure = write_take(ctx, shard, item.segment, take.audio, made, verdict, item.refused), None
    except Exception as exc:  # this utterance's, as on the one-at-a-time path, unless the disk is full
        if is_disk_full(exc):
            raise
        retry_or_fail(host, ctx, item, exc, queue)
        return
    host.record(shard, uid, row, failure)


def retry_or_fail(
    host: BatchHost, ctx: Context, item: Attempt, exc: BaseException, queue: deque, quiet: bool = False
) -> None:
    """Another attempt in a later batch, or the failure row once attempts run out (`quiet`: see note_error)."""
    uid = item.segment["id"]
    limit = ctx.settings.max_attempts
    note_error(uid, item.attempt, limit, exc, item.errors, quiet)
    if item.attempt < limit:
        item.attempt += 1
        queue.append(item)
        host.requeued(item)  # no longer under way: the slot may have it handed back, errors and all
        return
    host.record(item.shard, uid, None, failure_row(ctx, item.segment, item.errors, limit))
