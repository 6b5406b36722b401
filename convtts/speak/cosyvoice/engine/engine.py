"""The batched engine's loop: requests scheduled into rows, the LLM stepped for all rows, tokens drawn, audio rendered.

One loop for every model (v1's TransformerLM here, v2/v3's Qwen2 in qwen.py); what differs is
the runner (runner_v1, runner_qwen) and the flow. Two ways to draw tokens:

- on the CPU (Sampler, upstream's exact rule per row on the row's torch.Generator): each step's
  log-probabilities come to the host, the tokens go back; the reference;
- on the GPU (GpuSampler, static runners only), inside the step's CUDA graph: the next step is
  launched before the CPU reads the tokens of the last one, so the GPU never waits for the
  CPU's bookkeeping (a row that ended is stepped once more, and that step is thrown away).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import defaultdict, deque
from contextlib import contextmanager

import torch

from convtts.config import CosyVoiceConfig, PrecisionConfig
from convtts.speak.base import is_out_of_memory
from convtts.speak.cosyvoice.engine.audio import AudioStage
from convtts.speak.cosyvoice.engine.readback import TokenReadback
from convtts.speak.cosyvoice.engine.requests import RUNNING, EndlessDecode, Sequence, place
from convtts.speak.cosyvoice.engine.runner import DecodeOptions
from convtts.speak.cosyvoice.engine.runner_v1 import TransformerRunner, UpstreamTransformerRunner, supports_static
from convtts.speak.cosyvoice.engine.sampler import GpuSampler, Sampler
from convtts.speak.cosyvoice.engine.scheduler import Scheduler

log = logging.getLogger(__name__)

MAX_SILENT = 5  # upstream keeps at most this many silent tokens in a row


def supports(model) -> bool:
    """The engine drives v1's TransformerLM (CosyVoice-300M), in fp32 with the flow in PyTorch (not TensorRT)."""
    return llm_kind(model) == "TransformerLM" and plain_flow(model)


def llm_kind(model) -> str:
    """The class name of the model's LLM: TransformerLM (v1), Qwen2LM (v2) or CosyVoice3LM (v3)."""
    return type(getattr(getattr(model, "model", None), "llm", None)).__name__


def plain_flow(model) -> bool:
    """fp32, and the flow estimator a PyTorch module (TensorRT replaces it with an engine)."""
    inner = getattr(model, "model", None)
    estimator = getattr(getattr(getattr(inner, "flow", None), "decoder", None), "estimator", None)
    return getattr(inner, "fp16", False) is False and isinstance(estimator, torch.nn.Module)


def endless(seq: Sequence, ratio: float) -> EndlessDecode:
    text = int(seq.chunk["text"].shape[1])
    return EndlessDecode(
        f"chunk {seq.index + 1} of {len(seq.request.chunks)} decoded {len(seq.tokens)} speech tokens, its bound "
        f"({ratio:g} per text token of its {text}), without an end token: a text or voice prompt the model "
        "cannot say; not rendered"
    )


class StageTimer:
    """Seconds per stage of the loop, and the loop thread's CPU seconds in each (a stage far over its CPU
    waited: for the GPU, or for the interpreter's lock held by another thread); with `sync`, CUDA is
    synchronised around each (exact, slower)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.sync = False

    @contextmanager
    def __call__(self, stage: str):
        if self.sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            if self.sync and torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[stage] += time.perf_counter() - started
            self.cpu[stage] += time.thread_time() - cpu
            self.calls[stage] += 1

    def since(self, before: tuple[dict, dict, dict], wall: float) -> str:
        """Where `wall` seconds went since the snapshot `before`, e.g. 'read 41.0 s (5210), flow 30.2 s (96), ...;
        cpu read 2.1 s, flow 11.0 s, ...'."""
        seconds, calls, cpu = before
        spent = {stage: self.seconds[stage] - seconds.get(stage, 0.0) for stage in self.seconds}
        order = sorted(spent, key=spent.get, reverse=True)
        parts = [f"{stage} {spent[stage]:.1f} s ({self.calls[stage] - calls.get(stage, 0)})" for stage in order]
        used = [f"{stage} {self.cpu[stage] - cpu.get(stage, 0.0):.1f} s" for stage in order]
        return ", ".join(parts + [f"other {max(0.0, wall - sum(spent.values())):.1f} s"]) + "; cpu " + ", ".join(used)

    def snapshot(self) -> tuple[dict, dict, dict]:
        return dict(self.seconds), dict(self.calls), dict(self.cpu)


class BatchEngine:
    """Speaks lists of utterances with up to `max_rows` decoding at once."""

    runners = {"upstream": UpstreamTransformerRunner, "static": TransformerRunner}

    def __init__(
        self,
        model,
        max_rows: int,
        precision: PrecisionConfig | None = None,
        options: DecodeOptions | None = None,
        settings: CosyVoiceConfig | None = None,
    ):
        inner = model.model
        self.precision = precision or PrecisionConfig()
        self.options = options or DecodeOptions()
        self.inner = inner
        self.llm, self.flow, self.hift = inner.llm, inner.flow, inner.hift
        self.device = torch.device(inner.device)
        self.max_rows = max_rows
        self.silent = set(getattr(inner, "silent_tokens", []) or [])
        # Tokens that end a decode: v1 has one; v2 and v3 name theirs (3 and 200).
        self.stops = list(getattr(self.llm, "stop_token_ids", [self.llm.speech_token_size]))
        self.stop_set = set(self.stops)
        self.sampler = Sampler(self.llm)
        self.runner = self._runner()
        self.gpu_sampling = self._gpu_sampling()
        # the flow's and vocoder's passes: graphs, rows, memory (tts.cosyvoice)
        settings = settings or CosyVoiceConfig()
        self.audio = AudioStage(self.flow, self.hift, self.device, self.precision, settings)
        self.flush_share = settings.flow.flush_share
        # The bounds upstream's inference would use: its defaults, which a model's yaml may pin.
        bounds = inspect.signature(self.llm.inference).parameters
        self.ratios = float(bounds["min_token_text_ratio"].default), float(bounds["max_token_text_ratio"].default)
        self.scheduler: Scheduler | None = None
        self.timer = StageTimer()

    def _runner(self):
        kind = self.options.decode
        if kind == "static" and not self.static_supported():
            log.warning("this LLM's layers are not the ones our decode step reproduces: upstream's decode path runs")
            kind = "upstream"
        return self.runners[kind](self.llm, self.device, self.precision.llm, self.options)

    def static_supported(self) -> bool:
        return supports_static(self.llm)

    def _gpu_sampling(self) -> bool:
        possible = self.runner.static and self.sampler.options is not None
        if self.options.sampler == "auto":
            return possible and self.device.type == "cuda"
        if self.options.sampler == "gpu" and not possible:
            log.warning(
                "tokens are drawn on the CPU: GPU sampling needs the static decode and upstream's ras_sampling rule"
            )
        return self.options.sampler == "gpu" and possible

    @property
    def rows(self) -> list[Sequence]:
        """The sequences decoding now."""
        return self.scheduler.running if self.scheduler is not None else []

    @property
    def casts_llm(self) -> bool:
        """Whether the LLM's weights were cast (upstream's own path can no longer run them)."""
        return self.runner.casts

    def resize(self, rows: int) -> None:
        """Decode with `rows` rows from the next call on; what the decode held on the device is dropped now."""
        self.max_rows = rows
        self.runner.release_all()

    @property
    def flow_rows(self) -> int:
        """The flow runs once this many rows are decoded (or nothing else is left to decode): flow.flush_share."""
        return max(1, int(self.max_rows * self.flush_share))

    # -- the public call ---------------------------------------------------------------------
    def speak(self, requests, speed: float = 1.0):
        """Speak requests as rows free up; yield each one when its audio (or error) is final.

        `requests` may be a lazy iterator: it is read only when a row is free (or a few ahead, so
        that their text frontend runs while the GPU decodes), so a caller can stop feeding it (to
        rebuild the model) and get every request it did hand over back.
        """
        # keyed draws (GPU sampling) do not depend on their order: a request's chunks decode together
        together = self.gpu_sampling
        self.scheduler = Scheduler(self.max_rows, self.ratios, ahead=max(1, self.max_rows // 4), together=together)
        sampler = self._device_sampler if self.gpu_sampling else None
        started, before, spoken = time.perf_counter(), self.timer.snapshot(), 0
        graphs_before = self.flow_graphs()
        vocoder_before = self.vocoder_passes()
        try:
            with torch.inference_mode():
                self.runner.prepare(self.max_rows, sampler)
                decode = self._decode_ahead if self.gpu_sampling else self._decode
                for request in decode(iter(requests), speed):
                    spoken += 1
                    yield request
        finally:
            self._settle()
            wall = time.perf_counter() - started
            # one line a call (a worker makes one per model build and per run, about): where its time went
            passes, replayed, captured = (now - then for now, then in zip(self.flow_graphs(), graphs_before))
            vocoded, alone = (now - then for now, then in zip(self.vocoder_passes(), vocoder_before))
            log.info(
                "engine: %d utterances in %.1f s: %s; flow passes %d bucketed: %d replayed, %d captured; "
                "vocoder passes %d, %d of one row",
                spoken,
                wall,
                self.timer.since(before, wall),
                passes,
                replayed,
                captured,
                vocoded,
                alone,
            )

    def flow_graphs(self) -> tuple[int, int, int]:
        """The flow's bucketed passes so far, how many replayed a CUDA graph, graphs captured."""
        return self.audio.flow_pass.solver.graphs.counts()

    def vocoder_passes(self) -> tuple[int, int]:
        """The vocoder's passes so far, and how many of them held one row."""
        return self.audio.vocoder.passes, self.audio.vocoder.alone

    def _device_sampler(self, rows: int) -> GpuSampler:
        self.readback = TokenReadback(rows, self.device)
        return GpuSampler(self.sampler, self.runner.vocab, self.stops, rows, self.device)

    def _settle(self) -> None:
        """Wait for text frontends still at work (they share upstream's frontend with the next caller)."""
        if self.scheduler is not None:
            for request in self.scheduler.incoming:
                request.resolve()
        self.scheduler = None

    def _decode(self, source, speed: float):
        """Tokens drawn on the CPU: every step's log-probabilities come to the host."""
        scheduler = self.scheduler
        logp = None
        while not scheduler.finished():
            scheduler.fill(source)
            yield from scheduler.take_failed()
            for new in self._admit():
                logp = new if logp is None else torch.cat([logp, new])
            if scheduler.running:
                self._sample(logp)
                logp = self._step() if scheduler.running else None
            if scheduler.flow_due(self.flow_rows):
                yield from self._flush(speed)
            yield from scheduler.take_failed()

    def _decode_ahead(self, source, speed: float):
        """Tokens drawn on the GPU: step n+1 is launched before the tokens of step n are read."""
        scheduler = self.scheduler
        launched: deque = deque()
        while not scheduler.finished():
            scheduler.fill(source)
            yield from scheduler.take_failed()
            self._admit()  # first tokens drawn on the GPU: nothing comes back
            if scheduler.running:
                launched.append(self._step())
            while len(launched) > (1 if scheduler.running else 0):
                self._read(*launched.popleft())
            if scheduler.flow_due(self.flow_rows):
                yield from self._flush(speed)
            yield from scheduler.take_failed()

    # -- decode ------------------------------------------------------------------------------
    def _admit(self) -> list[torch.Tensor]:
        """Prefill the chunks that take free rows; their first log-probabilities, in admission order.

        Chunks admitted together prefill in groups (one forward each, where the runner batches them);
        a group that fails is prefilled again one chunk at a time, so only the faulty chunk fails.
        """
        logps = []
        for group in self.runner.groups(self.scheduler.admit()):
            if len(group) == 1:
                logps += self._prefill_each(group)
                continue
            try:
                with self.timer("prefill"):
                    logps += self.runner.prefill_many(group)
            except Exception as exc:
                if is_out_of_memory(exc):
                    raise
                log.warning("%d chunks failed to prefill together (%r): each is prefilled alone", len(group), exc)
                logps += self._prefill_each(group)
        return logps

    def _prefill_each(self, seqs) -> list[torch.Tensor]:
        """One prefill per chunk; a chunk whose prefill fails is abandoned (its utterance only)."""
        logps = []
        for seq in seqs:
            try:
                with self.timer("prefill"):
                    logps.append(self.runner.prefill(seq))
            except Exception as exc:
                if is_out_of_memory(exc):
                    raise
                self.scheduler.abandon(seq, exc)
        return logps

    def _step(self):
        """One decode step for every live row.

        Drawing on the CPU: returns their next log-probabilities, in the scheduler's row order.
        On the GPU: returns (the rows, the step's token readback), read later by _read.
        """
        rows = list(self.scheduler.running)
        with self.timer("step"):
            if not self.gpu_sampling:
                return self.runner.step(rows)
            bucket = self.runner.launch(rows)
            return rows, self.readback.start(self.runner.sampler.io, bucket)

    def _sample(self, logp) -> None:
        """Each live row draws its next token by the model's sampling rule on its own random stream."""
        rows = self.scheduler.running
        with self.timer("sample"):
            scores = logp.float().cpu()
            for i, seq in enumerate(rows):
                if len(seq.tokens) < seq.min_len or not seq.tokens:
                    scores[i, self.stops] = -float("inf")  # upstream's ignore_eos, and never an empty utterance
            tokens = self.sampler.draw(scores, rows)
        ended = []
        for seq, token in zip(list(rows), tokens):
            if isinstance(token, BaseException):
                seq.request.error = token
                ended.append(seq)
            elif not self._accept(seq, token):
                ended.append(seq)
        self._end(ended)

    def _read(self, rows: list[Sequence], pending) -> None:
        """The tokens a GPU step fed in and drew, for the rows that were live when it was launched."""
        with self.timer("read"):
            fed, drawn = self.readback.wait(pending)
        ended = []
        for seq in rows:
            if seq.status != RUNNING:  # it ended at an earlier step: this one was thrown away
                continue
            if not seq.started:  # its first token, drawn at the prefill, went in to this step
                seq.started = True
                if not self._accept(seq, fed[seq.row]):
                    ended.append(seq)
                    continue
            if not self._accept(seq, drawn[seq.row]):
                ended.append(seq)
        self._end(ended)

    def _accept(self, seq: Sequence, token: int) -> bool:
        """Take a drawn token; False when the sequence ended (a stop token, or its bound reached)."""
        if len(seq.tokens) >= seq.max_len or token in self.stop_set:
            return False
        self._keep(seq, token)
        if len(seq.tokens) < seq.max_len:
            return True
        if seq.max_len > seq.min_len:  # equal bounds fix the length (a pinned model): nothing ran away
            seq.request.error = seq.request.error or endless(seq, self.ratios[1])
        return False

    def _keep(self, seq: Sequence, token: int) -> None:
        seq.tokens.append(token)
        if token in self.silent:
            seq.silent_run += 1
            if seq.silent_run > MAX_SILENT:
                return
        else:
            seq.silent_run = 0
        seq.kept.append(token)

    def _end(self, ended: list[Sequence]) -> None:
        for seq in ended:
            self.scheduler.finish(seq, failed=seq.request.error is not None)
        if ended:
            self.runner.release(ended)

    # -- flow and vocoder --------------------------------------------------------------------
    def _flush(self, speed: float):
        """Flow and vocoder for the decoded rows together; yield the requests that are complete.

        Rows finish their decode a few at a time; gathering them first lets one flow pass serve
        many (on an H200 the flow of rows vocoded as they finished took 60% of the time). Once no
        input is left, the passes are wider (flow.tail_spread): the rows still decoding stop for
        each pass, and a short job's end is its slowest rows.
        """
        tail = self.scheduler.drained()
        seqs = self.scheduler.take_decoded()
        self.audio.render([seq for seq in seqs if seq.request.error is None and seq.kept], speed, tail, self.timer)
        for seq in seqs:
            if not seq.kept and seq.request.error is None:
                seq.request.error = RuntimeError("the LLM produced no speech tokens")
            place(seq.request.tokens, seq.index, seq.kept)
            request = self.scheduler.complete(seq)
            if request is not None:
                yield request
