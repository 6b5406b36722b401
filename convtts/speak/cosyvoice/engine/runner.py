"""Runs one model family's LLM for the engine: its precision, the prefill of a chunk, the decode steps.

Two kinds per family (runner_v1, runner_qwen):

- the upstream runner steps upstream's own layer modules over one cache padded on the left
  (PaddedCache); the reference, and what the engine did before static caches;
- the static runner steps our own decode code, from the same module weights, over a
  StaticCache, one CUDA graph per bucket (StepGraphs), and can draw the tokens on the GPU in
  the same graph (GpuSampler); the next step is launched before the CPU reads the last one.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from convtts.cuda_graphs import StepGraphs, length_bucket, row_bucket
from convtts.speak.cosyvoice.engine import attention
from convtts.speak.cosyvoice.engine.kvcache import PaddedCache, StaticCache, round_capacity

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HEADROOM = 2  # cache positions past a row's decode bound: the step launched before its end is read
# A batched prefill's group: at most this many chunks, and rows x positions^2 (the size of its attention
# scores) at most that of 16 prompts of 512 positions. For v1 in fp32 (16 heads) one layer's score tensors
# come to roughly 100-150 MB a row at 512 positions (estimated from their shapes, not measured), within the
# FLOW_MB_PER_ROW (200 MiB) that row_memory.py sets aside per row for flow work; a prefill and a flow pass never
# run at once. The prompts of 10-word chunks (text, and a zero-shot voice's speech tokens) are shorter.
PREFILL_ROWS = 16
PREFILL_AREA = 16 * 512 * 512

log = logging.getLogger(__name__)


def on_device(values, device: torch.device) -> torch.Tensor:
    """A small host tensor (or list of ints) on the device without waiting: a copy from pageable memory
    first waits for every kernel queued on the stream (the decode step launched ahead); from pinned
    memory it is queued behind them."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
    if device.type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class DecodeOptions:
    """How the engine runs the LLM (tts.cosyvoice: decode, cuda_graphs, compile, sampler; row_tokens from
    max_row_tokens)."""

    decode: str = "static"  # static: our step over a static cache; upstream: upstream's layers, padded cache
    cuda_graphs: bool = True  # static decode on CUDA: one graph per bucket
    compile: bool = False  # static decode: torch.compile the step (inside the graphs)
    sampler: str = "auto"  # cpu: upstream's exact rule per row; gpu: the same rule on the GPU; auto: gpu on CUDA
    attention: str = "auto"  # static step: triton (each row's own positions), torch, auto (triton where it runs)
    prefill: str = "auto"  # static: the family's own prefill (graphed on CUDA); upstream: its modules; auto: CUDA
    row_tokens: int = 1024  # static cache positions per row to start with (it grows when a chunk needs more)


def cast_llm(llm: torch.nn.Module, dtype: torch.dtype) -> bool:
    """Cast the LLM's weights to dtype, its speech-token head excepted (logits stay fp32); True if cast."""
    if dtype == torch.float32:
        return False
    llm.to(dtype)
    llm.llm_decoder.float()
    return True


class Runner:
    """The model-independent part: precision, logits in fp32."""

    static = False
    batched = False  # a static runner whose family supplies prompts(seqs) and prompt_length(seq)

    def __init__(self, llm, device, precision: str, options: DecodeOptions):
        self.llm, self.device, self.options = llm, device, options
        self.dtype = DTYPES[precision]
        self.tf32 = precision == "tf32"
        self.casts = cast_llm(llm, self.dtype)

    @contextmanager
    def precision(self):
        """TF32 matrix products for the LLM's work only (the flow and vocoder keep their own setting)."""
        if not self.tf32:
            yield
            return
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

    def logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Speech-token log-probabilities in fp32 from the last hidden states [rows, width]."""
        return self.llm.llm_decoder(hidden.float()).log_softmax(dim=-1)

    def release_all(self) -> None:
        """Drop what the decode holds on the device (the next prepare allocates again)."""

    def groups(self, seqs) -> list[list]:
        """The admitted sequences, in order, in groups that prefill_many takes at once: one by one here."""
        return [[seq] for seq in seqs]

    def prefill_many(self, seqs) -> list[torch.Tensor]:
        """prefill() of each sequence, in order; a family whose prompts batch does them in one forward."""
        return [self.prefill(seq) for seq in seqs]


class UpstreamRunner(Runner):
    """Upstream's layers over one left-padded cache of the live rows (they step in admission order)."""

    def prepare(self, rows: int, sampler=None) -> None:
        self.cache = PaddedCache()

    def release_all(self) -> None:
        self.cache = PaddedCache()

    def prefill(self, seq) -> torch.Tensor:
        with self.precision():
            logp, layers = self.prompt(seq)
        seq.prompt_len = layers[0].shape[2]
        self.cache.merge(seq, layers)
        return logp

    def release(self, seqs) -> None:
        self.cache.drop(set(seqs))

    def step(self, seqs) -> torch.Tensor:
        """Log-probabilities of every live row, in the order of `seqs` (the cache's order)."""
        if seqs != self.cache.order:
            raise RuntimeError("the padded cache's rows are not the rows asked for")
        with self.precision():
            return self.forward(seqs)

    def prompt(self, seq):
        raise NotImplementedError

    def forward(self, seqs) -> torch.Tensor:
        raise NotImplementedError


class StaticRunner(Runner):
    """Our decode step over a static cache: each sequence in a fixed row, steps bucketed and graphed.

    A family supplies `prompt(seq)` (log-probabilities and per-layer keys and values of the
    chunk's prompt), `tables(capacity)` (position tables) and `forward(rows, length)` (the last
    hidden states of the first `rows` rows, attending over `length` positions); with `batched`,
    also `prompts(seqs)` (prompt() of several chunks in one padded forward) and `prompt_length`.
    """

    static = True
    query_group = 1  # query heads a key head serves (grouped-query attention)
    relative = False  # v1's relative-position term in the step's attention
    prefiller = None  # the family's own prefill of several prompts, graphed (prefill_qwen.QwenPrefill)

    def __init__(
        self, llm, device, precision: str, options: DecodeOptions, layers: int, heads: int, dim: int, vocab: int
    ):
        super().__init__(llm, device, precision, options)
        self.shape = (layers, heads, dim)
        self.vocab = vocab
        self.cache: StaticCache | None = None
        self.sampler = None  # a GpuSampler when the step draws the tokens
        self.graphs: StepGraphs | None = None
        self.kernel = self._kernel(options.attention)

    def _kernel(self, choice: str) -> bool:
        """Whether the step's attention runs as attention.py's kernel (each row's own positions): asked for or
        auto, where Triton runs and the kernel passes its check for this head size and format."""
        return attention.kernel_chosen(
            choice,
            self.device,
            "tts.cosyvoice.attention",
            "the step's attention",
            lambda: attention.works(str(self.device), self.shape[2], self.dtype, self.query_group, self.relative),
        )

    def prepare(self, rows: int, sampler=None) -> None:
        """Allocate the cache for `rows` rows (again only if that changed); `sampler` builds a GpuSampler or is None."""
        if self.cache is not None and self.cache.rows == rows and (self.sampler is not None) == (sampler is not None):
            return
        self.release_all()
        layers, heads, dim = self.shape
        self.cache = StaticCache(
            layers, rows, heads, dim, round_capacity(self.options.row_tokens), self.dtype, self.device
        )
        self.sampler = sampler(rows) if sampler is not None else None
        self.logps = torch.zeros(rows, self.vocab, device=self.device)
        self._rebuild()

    def _rebuild(self) -> None:
        """Position tables and graphs for the cache's capacity."""
        self.tables(self.cache.capacity)
        state = [self.cache.lengths, self.cache.tokens] + (self.sampler.state() if self.sampler is not None else [])
        if self.graphs is not None:
            self.graphs.clear()
        self.graphs = StepGraphs(self.run_step, self.device, self.options.cuda_graphs, self.options.compile, state)

    def release_all(self) -> None:
        if self.graphs is not None:
            self.graphs.clear()
        self.cache = self.sampler = self.graphs = self.logps = None

    def prefill(self, seq) -> torch.Tensor:
        """The chunk's prompt into its row; returns the first token's log-probabilities [1, vocab]."""
        if self._own_prefill_takes([seq]):
            return self._prefill_own([seq])[0]
        with self.precision():
            return self._place_prompt(seq, *self.prompt(seq))

    def groups(self, seqs) -> list[list]:
        """Consecutive sequences up to PREFILL_ROWS, their padded attention within PREFILL_AREA (one alone if
        bigger); one by one where the family has no batched prompt."""
        if not self.batched:
            return super().groups(seqs)
        groups, longest = [], 0
        for seq in seqs:
            length = self.prompt_length(seq)
            wider = max(longest, length)
            if groups and len(groups[-1]) < PREFILL_ROWS and (len(groups[-1]) + 1) * wider**2 <= PREFILL_AREA:
                groups[-1].append(seq)
                longest = wider
            else:
                groups.append([seq])
                longest = length
        return groups

    def prefill_many(self, seqs) -> list[torch.Tensor]:
        """The prompts of `seqs` in one forward, each into its row; their first log-probabilities, in order."""
        if self._own_prefill_takes(seqs):
            return self._prefill_own(seqs)
        if not self.batched or len(seqs) == 1:
            return super().prefill_many(seqs)
        with self.precision():
            prompts = self.prompts(seqs)
            # the cache grows (if it must) once, for the longest need, before any row is written
            self.fit(max(keys[0].shape[2] + seq.max_len for seq, (_, keys, _) in zip(seqs, prompts)) + HEADROOM)
            for seq, (logp, keys, values) in zip(seqs, prompts):
                self.place(seq, logp, keys, values)
        return [logp for logp, _, _ in prompts]

    def _own_prefill_takes(self, seqs) -> bool:
        """Whether the family's own prefill takes these prompts (else the upstream modules prefill them)."""
        return self.prefiller is not None and self.prefiller.takes([self.prompt_length(seq) for seq in seqs])

    def _prefill_own(self, seqs) -> list[torch.Tensor]:
        """The prompts through the family's own prefill, their keys and values into their rows at once."""
        embedded = [self.embedded(seq) for seq in seqs]
        lengths = [len(e) for e in embedded]
        with self.precision():
            width = self.prefiller.run(embedded)
            self.fit(max(length + seq.max_len for seq, length in zip(seqs, lengths)) + HEADROOM)
            count = len(seqs)
            logp = self.logp(self.prefiller.last[:count])
            self.cache.fill_rows(
                on_device([seq.row for seq in seqs], self.device),
                self.prefiller.keys[:, :count, :, :width],
                self.prefiller.values[:, :count, :, :width],
                on_device(lengths, self.device),
            )
            for i, (seq, length) in enumerate(zip(seqs, lengths)):
                seq.prompt_len, seq.launched = length, 0
                if self.sampler is not None:
                    self.sampler.start(seq.row, seq, logp[i : i + 1], self.cache.tokens)
        return [logp[i : i + 1] for i in range(count)]

    def _place_prompt(self, seq, logp, keys, values) -> torch.Tensor:
        self.fit(keys[0].shape[2] + seq.max_len + HEADROOM)
        self.place(seq, logp, keys, values)
        return logp

    def place(self, seq, logp, keys, values) -> None:
        """A prompt's keys and values into the sequence's row; its first token drawn when the GPU draws."""
        seq.prompt_len = self.cache.fill(seq.row, keys, values)
        seq.launched = 0
        if self.sampler is not None:
            self.sampler.start(seq.row, seq, logp, self.cache.tokens)

    def fit(self, positions: int) -> None:
        """Grow the cache (and start new graphs) when a row needs more positions than it has."""
        if positions <= self.cache.capacity:
            return
        capacity = round_capacity(positions)
        log.info(
            "static KV cache grows from %d to %d positions per row (a chunk needs %d)",
            self.cache.capacity,
            capacity,
            positions,
        )
        self.cache = self.cache.grown(capacity)
        self._rebuild()

    def release(self, seqs) -> None:
        """Rows that left need nothing: their rows are written over by the next prefill."""

    def buckets(self, seqs) -> tuple[int, int]:
        rows = row_bucket(max(seq.row for seq in seqs) + 1, self.cache.rows)
        length = length_bucket(max(seq.prompt_len + seq.launched + 1 for seq in seqs), self.cache.capacity)
        return rows, length

    def step(self, seqs) -> torch.Tensor:
        """One step of `seqs` (their last tokens fed in); their log-probabilities, in their order."""
        rows_of = torch.tensor([seq.row for seq in seqs], device=self.device)
        self.cache.tokens.index_copy_(0, rows_of, torch.tensor([seq.tokens[-1] for seq in seqs], device=self.device))
        self._launch(seqs)
        return self.logps.index_select(0, rows_of)

    def launch(self, seqs) -> int:
        """One step of every row up to the last of `seqs`, tokens drawn on the GPU; returns the row bucket."""
        return self._launch(seqs)[0]

    def _launch(self, seqs) -> tuple[int, int]:
        rows, length = self.buckets(seqs)
        with self.precision():
            self.graphs.run(rows, length)
        for seq in seqs:
            seq.launched += 1
        return rows, length

    def run_step(self, rows: int, length: int) -> None:
        """The captured step: hidden states, log-probabilities (or drawn tokens), lengths advanced."""
        lengths = self.cache.lengths[:rows]
        logp = self.logp(self.forward(rows, length))
        if self.sampler is not None:
            self.sampler.step(logp, rows, self.cache.tokens)
        else:
            self.logps[:rows].copy_(logp)
        torch.clamp(lengths + 1, max=self.cache.capacity - 1, out=lengths)

    def prompt(self, seq):
        raise NotImplementedError

    def prompts(self, seqs) -> list[tuple]:
        """What prompt() returns for each of `seqs`, from one forward (families with `batched`)."""
        raise NotImplementedError

    def prompt_length(self, seq) -> int:
        """The positions of the sequence's prompt, before any of it runs (families with `batched`)."""
        raise NotImplementedError

    def embedded(self, seq) -> torch.Tensor:
        """The sequence's prompt as the backbone's inputs [positions, width] (families with a prefiller)."""
        raise NotImplementedError

    def tables(self, capacity: int) -> None:
        raise NotImplementedError

    def forward(self, rows: int, length: int) -> torch.Tensor:
        raise NotImplementedError
