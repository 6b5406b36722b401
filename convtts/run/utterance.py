"""One utterance: synthesise with bounded retries, write the audio atomically, build its manifest row.

Both paths (one at a time here, batched in batching.py) work on an explicit Context: the backend,
the quality gate, the output's layout and the settings they read, and nothing else of the worker.
"""

from __future__ import annotations

import io
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import soundfile as sf

from convtts.config import Config, OutputConfig
from convtts.speak.base import Backend, SynthesisError, is_out_of_memory
from convtts.state.layout import Layout
from convtts.state.rows import PLANNED
from convtts.state.shardio import DROPPED, KEPT, is_disk_full, write_atomic

log = logging.getLogger(__name__)

MANIFEST_FIELDS = PLANNED  # the plan's fields of each row (convtts/state/rows.py)


@dataclass(frozen=True)
class Settings:
    """The config an utterance reads: seeds, attempt and re-speak limits, the audio format, names."""

    seed: int
    max_attempts: int
    max_respeaks: int
    output: OutputConfig
    backend: str  # tts.backend, for failure rows
    run_id: str
    on_fail: str = "keep"  # validate.on_fail: what becomes of an utterance whose every take was refused

    @classmethod
    def of(cls, config: Config, run_id: str) -> Settings:
        return cls(
            config.workers.seed,
            config.workers.max_attempts,
            config.validate.max_respeaks,
            config.output,
            config.tts.backend,
            run_id,
            config.validate.on_fail,
        )


@dataclass(frozen=True)
class Context:
    """What speaking an utterance needs; a worker makes a new one at every model build."""

    backend: Backend
    gate: object | None  # convtts.gate.quality.Gate, or None when validate is off
    layout: Layout
    settings: Settings


@dataclass
class Attempt:
    """An utterance on its way: the attempt under way, the errors and refused takes so far, its shard.

    Both paths carry it, so an utterance moved from a batch to the one-at-a-time path (its rows
    fell to one, or its batch broke) keeps its count, its errors and its next take's seed.
    """

    segment: dict
    attempt: int  # the number of the attempt under way
    errors: list[str] = field(default_factory=list)
    started: float = 0.0  # 0: not begun (the slot may ask for it back)
    seed: int = 0
    refused: list = field(default_factory=list)  # the quality gate's reason for each refused take
    shard: str = ""  # the shard it belongs to: a batch may hold ids of several

    @classmethod
    def after_crashes(cls, segment: dict, crashes: int, shard: str, earlier: tuple = ()) -> Attempt:
        """Its first attempt in this process; `crashes` earlier ones killed a worker during this run, and
        each of `earlier` is the error of an attempt another worker spent on it before handing it back."""
        errors = [f"worker process died while speaking it ({crashes}x)"] if crashes else []
        return cls(segment, crashes + len(earlier) + 1, errors + list(earlier), shard=shard)


class Host(Protocol):
    """The worker, as the utterance paths see it: its context, model rebuilds, and where results go."""

    context: Context

    def rebuild_reason(self) -> str | None: ...
    def build(self, reason: str) -> None: ...
    def started(self, uid: str) -> None: ...
    def speak(self, item: Attempt) -> None: ...
    def record(self, shard: str, uid: str, row: dict | None, error: dict | None) -> None: ...


def synthesize_with_retries(host: Host, item: Attempt):
    """Return (manifest row, None) on success or (None, failure row) after the last attempt or take.

    `item` says where the utterance stands (attempts so far, their errors, refused takes). An
    error costs an attempt (workers.max_attempts) and the same take is tried again; a take the
    quality gate refuses costs a re-speak (validate.max_respeaks) and the next take has a new seed.
    Once every take was refused, validate.on_fail decides (settle_refused).
    """
    from convtts.gate.quality import QualityFailure, take_seed

    settings = host.context.settings
    shard, segment, uid = item.shard, item.segment, item.segment["id"]
    errors, refused, attempt = item.errors, item.refused, item.attempt
    while attempt <= settings.max_attempts:
        ctx = host.context  # a new one after a rebuild
        seed = take_seed(settings.seed, uid, len(refused))
        try:
            started = time.time()
            audio = ctx.backend.synthesize(segment["text"], segment["speaker"], seed)
            try:
                return keep_audio(ctx, shard, segment, audio, attempt, seed, started, refused), None
            except QualityFailure as bad:
                if respeak(uid, bad, refused, settings.max_respeaks):
                    continue
                made = (attempt, seed, time.time() - started)
                return settle_refused(ctx, shard, segment, audio, made, refused, errors)
        except Exception as exc:  # any error is this utterance's, never the shard's...
            if is_disk_full(exc):
                raise  # ...except a full disk: no utterance is at fault, the run stops (worker.serve)
            note_error(uid, attempt, settings.max_attempts, exc, errors)
            if is_out_of_memory(exc):
                host.build("out of GPU memory")
            attempt += 1
    return None, failure_row(host.context, segment, errors, settings.max_attempts)


def settle_refused(
    ctx: Context, shard: str, segment: dict, audio, made: tuple[int, int, float], refused: list, errors: list[str]
) -> tuple[dict | None, dict | None]:
    """(row, None) or (None, failure row) for an utterance whose last take the gate refused too, by
    validate.on_fail: keep writes that take, its row marked KEPT; drop records a DROPPED row in the
    manifest, without audio, as the id's final word; fail records the failure, which a rerun retries.
    `made` is the last take's (attempt, seed, synthesis seconds)."""
    last = refused[-1]
    policy = ctx.settings.on_fail
    if policy == "keep":
        row = write_take(ctx, shard, segment, audio, made, last.scores, refused[:-1])
        row.update(status=KEPT, refused=refusal(last))
        return row, None
    failure = quality_failure_row(ctx, segment, refused, made[0], errors)
    if policy == "drop":  # a manifest row, so the resume machinery counts the id as settled
        failure.update(status=DROPPED, seed=made[1], duration=0.0)
        return failure, None
    return None, failure


def refusal(bad) -> dict:
    """What the gate said of a refused take: `wer 0.83 > 0.6` as its check, figure and limit."""
    return {"reason": str(bad), "check": bad.check, "figure": bad.figure, "limit": bad.limit}


def respeak(uid: str, bad, refused: list, limit: int) -> bool:
    """Note a refused take; True if another take is allowed."""
    refused.append(bad)
    again = len(refused) <= limit
    log.warning(
        "%s take %d refused by the quality gate: %s%s",
        uid,
        len(refused) - 1,
        bad,
        "; speaking it again with a new seed" if again else "; no re-speaks left (validate.on_fail decides)",
    )
    return again


def keep_audio(
    ctx: Context, shard: str, segment: dict, audio, attempt: int, seed: int, started: float, refused: list = ()
) -> dict:
    """Check the audio (and gate it), write it atomically, return its manifest row; raises if the audio is bad.

    Nothing is written before the gate passes, so the resume contract is unchanged.
    """
    check_audio(audio)
    seconds = time.time() - started  # the gate's time is its own figure
    scores = None
    if ctx.gate:
        language = segment.get("language", "")
        scores = ctx.gate.judge(audio, ctx.backend.sample_rate, segment["text"], segment["id"], language)
    return write_take(ctx, shard, segment, audio, (attempt, seed, seconds), scores, refused)


def write_take(
    ctx: Context,
    shard: str,
    segment: dict,
    audio,
    made: tuple[int, int, float],
    scores: dict | None,
    refused: list = (),
) -> dict:
    """Write a take that passed the gate (scores None: no gate); `made` is (attempt, seed, synthesis seconds)."""
    rel = write_audio(ctx.layout, shard, segment["id"], audio, ctx.backend.sample_rate, ctx.settings.output)
    row = manifest_row(ctx, segment, rel, audio, *made)
    if scores is not None:
        row.update(quality=scores, respeaks=len(refused), respoken_for=[str(r) for r in refused])
    return row


def note_error(uid: str, attempt: int, limit: int, exc: BaseException, errors: list[str], quiet: bool = False) -> None:
    """Add a failed attempt's error to the utterance's list, and log it; `quiet`: at debug level, for an
    error of a whole batch, which its caller logs once for all of its utterances."""
    errors.append(f"{type(exc).__name__}: {exc}")
    log.log(logging.DEBUG if quiet else logging.WARNING, "%s attempt %d/%d failed: %s", uid, attempt, limit, errors[-1])


def first_sentence(text: str, limit: int = 200) -> str:
    """The first sentence of an error's text, for a log line: CUDA's out-of-memory message runs to a
    paragraph of allocator figures and advice."""
    line = text.strip().split("\n", 1)[0]
    match = re.match(r".*?[.!?](?=\s|$)", line)
    short = match.group(0) if match else line
    return short if len(short) <= limit else short[:limit] + "..."


def check_audio(audio: np.ndarray) -> None:
    if audio.ndim != 1 or audio.size == 0:
        raise SynthesisError(f"backend returned audio of shape {audio.shape}")
    if not np.isfinite(audio).all():
        raise SynthesisError("backend returned NaN or infinite samples")


def write_audio(layout: Layout, shard: str, uid: str, audio: np.ndarray, rate: int, output: OutputConfig) -> str:
    """Encode in memory, then write atomically (shardio.write_atomic): a kill never leaves half a file.

    Encoding first means the file is written by Python, whose OSError keeps its errno (ENOSPC),
    where libsndfile would report a failed write as a generic error.
    """
    ext = output.audio_format
    final = layout.audio_dir(shard) / f"{uid}.{ext}"
    encoded = io.BytesIO()
    sf.write(encoded, np.clip(audio, -1.0, 1.0), rate, subtype=output.subtype, format=ext.upper())
    write_atomic(final, encoded.getbuffer())
    return str(final.relative_to(layout.root))


def manifest_row(ctx: Context, segment: dict, rel: str, audio, attempt: int, seed: int, seconds: float) -> dict:
    """The utterance's row; the worker adds where and when it was made (Worker.record)."""
    rate = ctx.backend.sample_rate
    row = {k: segment.get(k) for k in MANIFEST_FIELDS}
    row.update(
        audio=rel,
        duration=round(len(audio) / rate, 4),
        num_samples=int(len(audio)),
        sample_rate=rate,
        backend=ctx.backend.name,
        status="ok",
        attempts=attempt,
        seed=seed,
        synthesis_seconds=round(seconds, 4),
        run=ctx.settings.run_id,
    )
    prompt_audio = ctx.backend.prompt_audio(segment.get("speaker"))  # a zero-shot voice's recording
    if prompt_audio is not None:
        row["prompt_audio"] = prompt_audio
    return row


def failure_row(ctx: Context, segment: dict, errors: list[str], attempts: int) -> dict:
    return {
        "id": segment["id"],
        "conversation_id": segment.get("conversation_id"),
        "turn": segment.get("turn"),
        "segment": segment.get("segment"),
        "role": segment.get("role"),
        "speaker": segment.get("speaker"),
        "text": segment.get("text"),
        "status": "failed",
        "reason": errors[-1][:2000],
        "errors": [e[:500] for e in errors],
        "attempts": attempts,
        "backend": ctx.settings.backend,
        "run": ctx.settings.run_id,
        "time": time.time(),
    }


def quality_failure_row(ctx: Context, segment: dict, refused: list, attempts: int, errors: list[str] = ()) -> dict:
    """The failure row of an utterance whose every take the gate refused: the last take's check and figure.

    `errors` are the errors of earlier attempts on the way, listed first.
    """
    last = refused[-1]
    takes = [f"take {n}: {bad}" for n, bad in enumerate(refused)]
    row = failure_row(ctx, segment, [*errors, *takes], attempts)
    row.update(
        reason=str(last),
        check=last.check,
        figure=last.figure,
        limit=last.limit,
        quality=last.scores,
        respeaks=len(refused) - 1,
    )
    return row
