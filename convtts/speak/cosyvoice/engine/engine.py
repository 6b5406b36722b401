"""v1's batched engine: continuous batching of the LLM decode, the flow for rows of close lengths, the vocoder."""
from __future__ import annotations

import inspect
import logging
from collections import deque

import torch
import torch.nn.functional as F

from convtts.config import CosyVoiceConfig, PrecisionConfig
from convtts.speak.base import is_out_of_memory
from convtts.speak.cosyvoice.engine.flow import Flow
from convtts.speak.cosyvoice.engine.requests import Request, Row
from convtts.speak.cosyvoice.engine.sampler import Sampler
from convtts.speak.cosyvoice.engine.vocoder import Vocoder

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


class BatchEngine:
    """Speaks lists of utterances with up to `max_rows` decoding at once."""

    def __init__(self, model, max_rows: int, precision: PrecisionConfig | None = None,
                 settings: CosyVoiceConfig | None = None):
        inner = model.model
        self.precision = precision or PrecisionConfig()
        self.inner = inner
        self.llm, self.flow, self.hift = inner.llm, inner.flow, inner.hift
        self.device = inner.device
        self.max_rows = max_rows
        self.silent = set(getattr(inner, "silent_tokens", []) or [])
        self.sos = getattr(self.llm, "sos", getattr(self.llm, "sos_eos", 0))
        self.eos = self.llm.speech_token_size
        # Tokens that end a decode: v1 has one; v2 and v3 name theirs (3 and 200).
        self.stops = list(getattr(self.llm, "stop_token_ids", [self.eos]))
        self.kv: list[torch.Tensor] = []
        self.rows: list[Row] = []
        self.failed_early: list[Request] = []
        self.decoded: list[Row] = []  # rows whose decode ended, waiting for the flow
        self.sampler = Sampler(self.llm)
        settings = settings or CosyVoiceConfig()  # the flow's and vocoder's passes: graphs, rows, memory
        self.flow_pass = Flow.configured(self.flow, self.precision.flow, settings, self.device)
        self.vocoder = Vocoder.configured(self.hift, self.precision.vocoder, settings)
        # The bounds upstream's inference would use: its defaults, which a model's yaml may pin.
        bounds = inspect.signature(self.llm.inference).parameters
        self.min_ratio = float(bounds["min_token_text_ratio"].default)
        self.max_ratio = float(bounds["max_token_text_ratio"].default)

    @property
    def flow_rows(self) -> int:
        """The flow runs once this many rows are decoded (or nothing else is left to decode)."""
        return max(1, self.max_rows // 2)

    # -- the public call ---------------------------------------------------------------------
    def speak(self, requests, speed: float = 1.0):
        """Speak requests as rows free up; yield each one when its audio (or error) is final.

        `requests` may be a lazy iterator: it is read only when a row is free, so a caller can stop
        feeding it (to rebuild the model) and get every request it did hand over back.
        """
        source = iter(requests)
        waiting: deque = deque()
        self.kv, self.rows = [], []
        logp = None
        with torch.inference_mode():
            while True:
                self._fill(waiting, source)
                yield from self._take_failed()
                if not waiting and not self.rows:
                    if not self.decoded:
                        break
                    yield from self._flush(waiting, speed)  # may queue the requests' next chunks
                    continue
                logp = self._admit(waiting, logp)
                finished = self._sample(logp)
                self.decoded += [row for row in self.rows if row in finished]
                self._drop(finished)
                logp = self._step() if self.rows else None
                if len(self.decoded) >= self.flow_rows:
                    yield from self._flush(waiting, speed)
                yield from self._take_failed()
        self.kv, self.rows, self.decoded = [], [], []

    def _flush(self, waiting: deque, speed: float):
        """Flow and vocoder for the decoded rows together; yield the requests that are complete.

        Rows finish their decode a few at a time; gathering them first lets one flow pass serve
        many (on an H200 the flow of rows vocoded as they finished took 60% of the time).
        """
        rows, self.decoded = self.decoded, []
        self._vocode([row for row in rows if row.request.error is None and row.kept], speed)
        for row in rows:
            if not row.kept and row.request.error is None:
                row.request.error = RuntimeError("the LLM produced no speech tokens")
            if self._chain(row, waiting):
                yield row.request

    def _take_failed(self) -> list[Request]:
        failed, self.failed_early = self.failed_early, []
        return failed

    def _fill(self, waiting: deque, source) -> None:
        """Take new requests while rows are free (their first chunk waits for a row)."""
        while len(self.rows) + len(waiting) < self.max_rows:
            request = next(source, None)
            if request is None:
                return
            if request.error is not None or not request.chunks:  # the frontend failed, or no text
                request.error = request.error or RuntimeError("nothing to speak in the text")
                self.failed_early.append(request)
                continue
            request.next_chunk = 1
            waiting.append((request, request.chunks[0]))

    def _chain(self, row: Row, waiting: deque) -> bool:
        """Queue the request's next chunk, or say it is finished."""
        request = row.request
        if request.error is None and request.next_chunk < len(request.chunks):
            waiting.appendleft((request, request.chunks[request.next_chunk]))
            request.next_chunk += 1
            return False
        return True

    # -- decode ------------------------------------------------------------------------------
    def _admit(self, waiting: deque, logp):
        """Prefill waiting chunks into free rows; returns the log-probabilities of every live row."""
        new = []
        while waiting and len(self.rows) + len(new) < self.max_rows:
            request, chunk = waiting.popleft()
            try:
                new.append(self._prefill(request, chunk))
            except Exception as exc:  # this utterance only
                if is_out_of_memory(exc):
                    raise
                request.error = exc
                self.failed_early.append(request)
        for row, kv, row_logp in new:
            self._merge(row, kv)
            logp = row_logp if logp is None else torch.cat([logp, row_logp])
        return logp

    def _prefill(self, request: Request, chunk: dict):
        """Upstream's first decode step for one chunk: its prompt through forward_chunk."""
        lm_input, text_len = self._lm_input(chunk)
        size = lm_input.shape[1]
        mask = torch.tril(torch.ones((1, size, size), device=self.device)).to(torch.bool)
        empty = torch.zeros((0, 0, 0, 0), device=self.device)
        out, cache, _ = self.llm.llm.forward_chunk(lm_input, offset=0, required_cache_size=-1,
                                                   att_cache=empty, cnn_cache=empty, att_mask=mask)
        logp = self.llm.llm_decoder(out[:, -1]).log_softmax(dim=-1)
        prompt_len = chunk["prompt_text"].shape[1] if "prompt_text" in chunk else 0
        text_only = text_len - prompt_len
        row = Row(request, chunk, min_len=int(text_only * self.min_ratio), max_len=int(text_only * self.max_ratio))
        return row, [cache[i:i + 1] for i in range(cache.shape[0])], logp

    def _lm_input(self, chunk: dict):
        """[sos, speaker, text, task id, prompt speech] embeddings, as TransformerLM.inference builds them."""
        llm, device = self.llm, self.device
        text = chunk["text"].to(device)
        prompt_text = chunk.get("prompt_text", torch.zeros(1, 0, dtype=torch.int32)).to(device)
        text = torch.concat([prompt_text, text], dim=1)
        text_len = torch.tensor([text.shape[1]], dtype=torch.int32, device=device)
        text, _ = llm.encode(llm.text_embedding(text), text_len)
        embedding = chunk.get("llm_embedding", torch.zeros(0, 192)).to(device)
        if embedding.shape[0] != 0:
            embedding = llm.spk_embed_affine_layer(F.normalize(embedding, dim=1)).unsqueeze(dim=1)
        else:
            embedding = torch.zeros(1, 0, llm.llm_input_size, dtype=text.dtype, device=device)
        sos = llm.llm_embedding.weight[self.sos].reshape(1, 1, -1)
        task = llm.llm_embedding.weight[llm.task_id].reshape(1, 1, -1)
        prompt_speech = chunk.get("llm_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32)).to(device)
        prompt_emb = llm.speech_embedding(prompt_speech) if prompt_speech.shape[1] else \
            torch.zeros(1, 0, llm.llm_input_size, dtype=text.dtype, device=device)
        return torch.concat([sos, embedding, text, task, prompt_emb], dim=1), int(text_len.item())

    def _merge(self, row: Row, kv: list[torch.Tensor]) -> None:
        """Add a row's cache: the shorter side is padded on the left (masked out in attention)."""
        if not self.rows:
            self.kv, self.rows = kv, [row]
            return
        length, new_length = self.kv[0].shape[2], kv[0].shape[2]
        if new_length < length:
            kv = [F.pad(k, (0, 0, length - new_length, 0)) for k in kv]
            row.pad = length - new_length
        elif new_length > length:
            self.kv = [F.pad(k, (0, 0, new_length - length, 0)) for k in self.kv]
            for other in self.rows:
                other.pad += new_length - length
        self.kv = [torch.cat([a, b]) for a, b in zip(self.kv, kv)]
        self.rows.append(row)

    def _drop(self, finished: set) -> None:
        """Remove finished rows and the left padding every remaining row shares."""
        if not finished:
            return
        keep = [i for i, row in enumerate(self.rows) if row not in finished]
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.kv = []
            return
        index = torch.tensor(keep, device=self.device)
        shared = min(row.pad for row in self.rows)
        self.kv = [k.index_select(0, index)[:, :, shared:] for k in self.kv]
        for row in self.rows:
            row.pad -= shared

    def _sample(self, logp) -> set:
        """Each live row draws its next token by the model's sampling rule on its own random stream."""
        finished = set()
        if not self.rows:
            return finished
        scores = logp.float().cpu()
        for i, row in enumerate(self.rows):
            if len(row.tokens) < row.min_len or not row.tokens:
                scores[i, self.stops] = -float("inf")  # upstream's ignore_eos, and never an empty utterance
        tokens = self.sampler.draw(scores, self.rows)
        for row, token in zip(self.rows, tokens):
            if isinstance(token, BaseException):
                row.request.error = token
                finished.add(row)
            elif len(row.tokens) >= row.max_len or token in self.stops:
                finished.add(row)
            else:
                self._keep(row, token)
                if len(row.tokens) >= row.max_len:
                    finished.add(row)
        return finished

    def _keep(self, row: Row, token: int) -> None:
        row.tokens.append(token)
        if token in self.silent:
            row.silent_run += 1
            if row.silent_run > MAX_SILENT:
                return
        else:
            row.silent_run = 0
        row.kept.append(token)

    def _step(self):
        """One decode step for every live row: the last token in, the next log-probabilities out."""
        encoder = self.llm.llm
        tokens = torch.tensor([row.tokens[-1] for row in self.rows], device=self.device)
        xs = self.llm.speech_embedding.weight[tokens].unsqueeze(1)
        length = self.kv[0].shape[2]
        xs, _, _ = encoder.embed(xs, torch.ones(len(self.rows), 1, 1, dtype=torch.bool, device=self.device), length)
        pos_emb = encoder.embed.position_encoding(offset=0, size=length + 1)
        pads = torch.tensor([row.pad for row in self.rows], device=self.device)
        mask = (torch.arange(length + 1, device=self.device)[None, :] >= pads[:, None]).unsqueeze(1)
        empty = torch.zeros((0, 0, 0, 0), device=self.device)
        for i, layer in enumerate(encoder.encoders):
            xs, _, self.kv[i], _ = layer(xs, mask, pos_emb, att_cache=self.kv[i], cnn_cache=empty)
        if encoder.normalize_before:
            xs = encoder.after_norm(xs)
        return self.llm.llm_decoder(xs[:, -1]).log_softmax(dim=-1)

    # -- flow and vocoder --------------------------------------------------------------------
    def _vocode(self, rows: list[Row], speed: float) -> None:
        """Flow passes for the rows (close lengths together), then the vocoder for all of them:
        its passes take rows of close lengths across the flow's groups."""
        done = [pair for group in self.flow_pass.groups(rows) for pair in self._mels(group)]
        for (row, _), audio in zip(done, self._hift([row.request for row, _ in done], [mel for _, mel in done], speed)):
            if isinstance(audio, BaseException):
                row.request.error = audio
            else:
                row.request.audio.append(audio)

    def _mels(self, rows: list[Row]) -> list[tuple[Row, torch.Tensor]]:
        """(row, mel) for the rows whose flow pass worked; a failing pass is retried row by row."""
        try:
            return list(zip(rows, self._flow(rows)))
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            if len(rows) == 1:
                rows[0].request.error = exc
                return []
            return [pair for row in rows for pair in self._mels([row])]  # the others are spoken alone

    def _flow(self, rows: list[Row]) -> list[torch.Tensor]:
        return self.flow_pass.mels(rows)

    def _hift(self, requests: list[Request], mels: list[torch.Tensor], speed: float) -> list:
        """Each row's samples, or the exception its vocoding raised (an out-of-memory propagates)."""
        return self.vocoder.speak(requests, mels, speed)
