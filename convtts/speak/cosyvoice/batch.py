"""Batched CosyVoice v1 synthesis: many utterances share each LLM decode step and each flow pass.

Upstream speaks one utterance per call (its decode asserts a batch of one), so a worker's GPU
waits on kernel launches most of the time. This engine drives upstream's own modules and weights
as the official classes loaded them, in a loop of ours:

- the text frontend runs per utterance, exactly as `inference_sft` / `inference_zero_shot` do;
- the LLM prefill runs per utterance through upstream's `forward_chunk`; the decode steps then
  run all live rows through the encoder layers together, with a left-padded KV cache and masks,
  and rows join as others finish (continuous batching);
- each row samples with upstream's own sampling rule on its own random stream, so an utterance
  sounds the same whichever rows it shared a batch with (up to float rounding);
- flow matching runs for the finished rows together (padding and masks), the vocoder per row.
"""
from __future__ import annotations

import inspect
import logging
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from convtts.speak.base import is_out_of_memory

log = logging.getLogger(__name__)

SAMPLING_K = 25  # upstream's default `sampling` argument of TransformerLM.inference
MAX_SILENT = 5  # upstream keeps at most this many silent tokens in a row


@dataclass(eq=False)
class Request:
    """One utterance: the caller's key for it, its frontend inputs (one dict per text chunk), its seed."""
    key: object
    chunks: list[dict]
    seed: int
    generator: torch.Generator = None  # this utterance's own random stream (CPU)
    audio: list[np.ndarray] = field(default_factory=list)
    error: BaseException | None = None
    next_chunk: int = 0

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)


@dataclass(eq=False)
class Row:
    """One text chunk in the decode: its cache padding, sampled tokens and bounds."""
    request: Request
    chunk: dict
    min_len: int
    max_len: int
    pad: int = 0
    tokens: list[int] = field(default_factory=list)  # every sampled token (the repetition window)
    kept: list[int] = field(default_factory=list)  # what the flow gets (long silences trimmed)
    silent_run: int = 0


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


@contextmanager
def own_random_stream(request: Request):
    """Run upstream code that draws from torch's global CPU generator on this request's stream."""
    saved = torch.get_rng_state()
    torch.set_rng_state(request.generator.get_state())
    try:
        yield
    finally:
        request.generator.set_state(torch.get_rng_state())
        torch.set_rng_state(saved)


class BatchEngine:
    """Speaks lists of utterances with up to `max_rows` decoding at once."""

    def __init__(self, model, max_rows: int):
        inner = model.model
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
        self.hift_finalizes = "finalize" in inspect.signature(self.hift.inference).parameters  # v3's HiFT
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
        for group in length_groups([row for row in rows if row.request.error is None and row.kept]):
            self._vocode(group, speed)
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
        if not rows:
            return
        try:
            mels = self._flow(rows)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            if len(rows) == 1:
                rows[0].request.error = exc
                return
            for row in rows:  # find the row that fails: the others are spoken alone
                self._vocode([row], speed)
            return
        for row, mel in zip(rows, mels):
            try:
                row.request.audio.append(self._hift(row.request, mel, speed))
            except Exception as exc:
                row.request.error = exc

    def _flow(self, rows: list[Row]) -> list[torch.Tensor]:
        return flow_batch(self.flow, rows, self.device)

    def _hift(self, request: Request, mel: torch.Tensor, speed: float) -> np.ndarray:
        """Upstream's non-streaming vocoder call for one utterance (v3's HiFT takes `finalize`)."""
        if speed != 1.0:
            mel = F.interpolate(mel, size=int(mel.shape[2] / speed), mode="linear")
        if self.device.type == "cuda":
            torch.cuda.manual_seed(request.seed)  # the vocoder's noise, drawn on the GPU
        with own_random_stream(request):
            if self.hift_finalizes:
                speech, _ = self.hift.inference(speech_feat=mel, finalize=True)
            else:
                speech, _ = self.hift.inference(speech_feat=mel, cache_source=torch.zeros(1, 1, 0))
        return speech.float().cpu().numpy().reshape(-1)


class Sampler:
    """The model's sampling rule for all rows of a step, each row drawing from its own generator.

    CosyVoice's yaml names ras_sampling (nucleus sampling within top_p and top_k; a token seen in
    the last win_size draws is re-drawn from the whole distribution). For that rule this does the
    sort and the cumulative sums for all rows at once and draws exactly as the installed upstream
    does (one multinomial on the kept probabilities, then one on the full distribution if needed,
    without the repeated token in newer releases); any other
    rule is called as upstream calls it, row by row.
    """

    def __init__(self, llm):
        rule = llm.sampling
        self.llm = llm
        self.options = None
        if getattr(getattr(rule, "func", None), "__name__", "") == "ras_sampling":
            defaults = {k: v.default for k, v in inspect.signature(rule.func).parameters.items()}
            self.options = {k: rule.keywords.get(k, defaults[k]) for k in ("top_p", "top_k", "win_size", "tau_r")}
            self.masks_repeat = self._masks_repeat(rule)

    @staticmethod
    def _masks_repeat(rule) -> bool:
        """Whether this upstream's re-draw leaves the repeated token out (newer releases) or not.

        Asked of upstream's own function: a distribution with all its mass on token 0, which the
        last draws repeat, is re-drawn; only a rule that masks token 0 can return another token.
        """
        scores = torch.full((8,), -1e4)
        scores[0] = 0.0
        with torch.random.fork_rng(devices=[]):
            return int(rule(scores, [0] * 20, SAMPLING_K)) != 0

    def draw(self, scores: torch.Tensor, rows: list) -> list:
        if self.options is None:
            return [self._upstream(scores[i], row) for i, row in enumerate(rows)]
        top_p, top_k = self.options["top_p"], self.options["top_k"]
        probs = scores.softmax(dim=-1)
        values, index = stable_top(probs, min(top_k, probs.shape[-1]))
        before = torch.cat([torch.zeros_like(values[:, :1]), values.cumsum(dim=-1)[:, :-1]], dim=-1)
        kept = (before < top_p).sum(dim=-1).tolist()
        tokens = []
        for i, row in enumerate(rows):
            g = row.request.generator
            token = int(index[i, torch.multinomial(values[i, :kept[i]], 1, replacement=True, generator=g)])
            recent = row.tokens[-self.options["win_size"]:]
            if recent.count(token) >= self.options["win_size"] * self.options["tau_r"]:
                again = scores[i].clone()
                if self.masks_repeat:
                    again[token] = -float("inf")
                token = int(torch.multinomial(again.softmax(dim=0), 1, replacement=True, generator=g))
            tokens.append(token)
        return tokens

    def _upstream(self, scores: torch.Tensor, row):
        try:
            with own_random_stream(row.request):
                return int(self.llm.sampling(scores.clone(), row.tokens, SAMPLING_K))
        except Exception as exc:
            return exc


def stable_top(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of each row's stable descending sort (equal values: lower index first), fast.

    Upstream sorts the whole distribution (stable); a random-weight model has exact ties often
    enough that topk's arbitrary order among them changes draws. topk finds the set, a stable sort
    of those k orders it, and a row with a tie across the k-th place is sorted in full.
    """
    values, index = probs.topk(k, dim=-1)
    index, by_index = index.sort(dim=-1)
    values, order = values.gather(-1, by_index).sort(dim=-1, descending=True, stable=True)
    index = index.gather(-1, order)
    crowded = ((probs >= values[:, -1:]).sum(dim=-1) > k).nonzero().flatten().tolist()
    for row in crowded:
        full_values, full_index = probs[row].sort(descending=True, stable=True)
        values[row], index[row] = full_values[:k], full_index[:k]
    return values, index


SPREAD = 1.25  # longest over shortest row in one flow pass


def length_groups(rows: list[Row]) -> list[list[Row]]:
    """Rows by decoded length, cut where the longest would pass SPREAD times the shortest.

    A flow pass pads its rows to the longest, and the estimator's group norms count the padded
    frames: rows of close lengths keep each one near its solo rendering and waste little work.
    """
    groups: list[list[Row]] = []
    for row in sorted(rows, key=lambda r: len(r.kept)):
        if groups and len(row.kept) <= SPREAD * len(groups[-1][0].kept):
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def flow_batch(flow, rows: list[Row], device) -> list[torch.Tensor]:
    """v1 flow (MaskedDiffWithXvec.inference) for several rows at once; returns each row's mel."""
    prompt_tokens = [flow_prompt_tokens(row).shape[1] for row in rows]
    feats = [row.chunk.get("prompt_speech_feat", torch.zeros(1, 0, 80)) for row in rows]
    embedded, lengths = embed_flow_tokens(flow, rows, device)
    h, _ = flow.encoder(embedded, lengths)
    h = flow.encoder_proj(h)
    mels = []
    for i, row in enumerate(rows):
        len1, total = prompt_tokens[i], int(lengths[i])
        mel_len1 = feats[i].shape[1]
        mel_len2 = int((total - len1) / flow.input_frame_rate * 22050 / 256)
        mel, _ = flow.length_regulator.inference(h[i:i + 1, :len1], h[i:i + 1, len1:total], mel_len1, mel_len2, flow.input_frame_rate)
        mels.append((mel[0], mel_len1, mel_len2))
    return solve(flow.decoder, rows, mels, feats, flow_speakers(flow, rows, device), device)


def flow_prompt_tokens(row: Row) -> torch.Tensor:
    return row.chunk.get("flow_prompt_speech_token", torch.zeros(1, 0, dtype=torch.int32))


def embed_flow_tokens(flow, rows: list[Row], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's prompt speech tokens and decoded tokens, padded on the right and embedded
    (padding zeroed), as the flow's inference embeds one row; returns them and the lengths."""
    # The frontend leaves prompt tensors on the model's device; the tokens are assembled on the CPU.
    tokens = [torch.cat([flow_prompt_tokens(row).reshape(-1).to("cpu", torch.long), torch.tensor(row.kept, dtype=torch.long)])
              for row in rows]
    lengths = torch.tensor([len(t) for t in tokens], dtype=torch.int32, device=device)
    padded = torch.nn.utils.rnn.pad_sequence(tokens, batch_first=True).to(device)
    keep = (torch.arange(padded.shape[1], device=device)[None, :] < lengths[:, None]).unsqueeze(-1)
    return flow.input_embedding(torch.clamp(padded, min=0)) * keep, lengths


def flow_speakers(flow, rows: list[Row], device) -> torch.Tensor:
    """The rows' speaker embeddings, normalised and projected as the flow's inference does."""
    embeddings = [row.chunk.get("flow_embedding", torch.zeros(1, 192)).to(device).reshape(1, -1) for row in rows]
    return flow.spk_embed_affine_layer(F.normalize(torch.cat(embeddings), dim=1))


def solve(decoder, rows, mels, feats, spks, device) -> list[torch.Tensor]:
    """Upstream's Euler solve with classifier-free guidance, for padded rows under one mask."""
    width = max(m.shape[0] for m, _, _ in mels)
    batch = len(rows)
    mu = torch.zeros(batch, 80, width, device=device, dtype=spks.dtype)
    cond = torch.zeros_like(mu)
    mask = torch.zeros(batch, 1, width, device=device, dtype=spks.dtype)
    x = torch.zeros_like(mu)
    for i, (row, (mel, len1, len2)) in enumerate(zip(rows, mels)):
        size = mel.shape[0]
        mu[i, :, :size] = mel.transpose(0, 1)
        mask[i, :, :size] = 1
        if len1:
            cond[i, :, :len1] = feats[i][0].to(device).transpose(0, 1)
        with own_random_stream(row.request):  # upstream: randn_like(mu), drawn after the decode
            x[i, :, :size] = torch.randn(1, 80, size)[0].to(device)
    x = euler(decoder, x, mask, mu, spks, cond)
    return [x[i:i + 1, :, len1:len1 + len2].float() for i, (_, len1, len2) in enumerate(mels)]


def euler(decoder, x, mask, mu, spks, cond, **options) -> torch.Tensor:
    """Upstream's 10 Euler steps with classifier-free guidance (solve_euler), for any number of rows.

    The first half of each estimator call is conditioned, the second has mu, speaker and prompt
    zeroed; `options` go to the estimator (v2/v3 take streaming=False).
    """
    batch = x.shape[0]
    t_span = torch.linspace(0, 1, 11, device=x.device, dtype=mu.dtype)  # upstream's n_timesteps=10
    if decoder.t_scheduler == "cosine":
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
    t, dt = t_span[0].unsqueeze(0), t_span[1] - t_span[0]
    zeros = torch.zeros_like(mu)
    rate = decoder.inference_cfg_rate
    for step in range(1, len(t_span)):
        out = decoder.forward_estimator(
            torch.cat([x, x]), torch.cat([mask, mask]), torch.cat([mu, zeros]),
            t.expand(2 * batch).contiguous(), torch.cat([spks, torch.zeros_like(spks)]), torch.cat([cond, zeros]),
            **options,
        )
        guided, free = torch.split(out, [batch, batch], dim=0)
        x = x + dt * ((1.0 + rate) * guided - rate * free)
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return x
