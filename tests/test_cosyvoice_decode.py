"""Our decode steps against upstream's, step by step; the GPU sampler against upstream's rule (CPU, random weights).

The static runners reproduce upstream's LLM layers from the modules' own weights: v1's
relative-position encoder layers (checked against TransformerEncoder.forward_chunk, the call
TransformerLM.inference makes) and the Qwen2 layers of v2/v3 (checked against the backbone's
own decode step, as Qwen2LM.inference runs it). Rows of different lengths share each step, in
rows with a dead one between them, past a length bucket and a cache growth, and a row admitted
into a freed row sees nothing of the row before it. fp32: the log-probabilities agree to 1e-5.
"""

from __future__ import annotations

import functools

import pytest
import torch

from conftest import qwen_llm, sequence, v1_llm
from convtts.cuda_graphs import length_bucket, row_bucket, row_buckets
from convtts.speak.cosyvoice.engine.requests import Sequence
from convtts.speak.cosyvoice.engine.runner import DTYPES, DecodeOptions

STEPS = 130  # past the first length bucket (128 positions)
FP32 = dict(rtol=1e-5, atol=1e-5)
# bf16 or fp16 weights and activations, fp32 logits: teacher-forced on the same tokens, the log-probabilities
# of 30 random-weight steps stay this close to fp32's (measured at most: bf16 0.019 for v1, 0.011 for Qwen2;
# fp16 0.0024 and 0.0014).
HALF = {"bf16": dict(rtol=0, atol=0.06), "fp16": dict(rtol=0, atol=0.008)}


class V1Reference:
    """One row decoded as TransformerLM.inference does: the prompt, then one forward_chunk per token."""

    def __init__(self, llm, seq):
        from convtts.speak.cosyvoice.engine.runner_v1 import sos_of, v1_prefill, v1_prompt

        self.llm = llm
        hidden, self.cache = v1_prefill(llm, v1_prompt(llm, seq.chunk, sos_of(llm), torch.device("cpu"), torch.float32))
        self.first = llm.llm_decoder(hidden).log_softmax(dim=-1)

    def step(self, token: int) -> torch.Tensor:
        x = self.llm.speech_embedding.weight[token].reshape(1, 1, -1)
        empty = torch.zeros((0, 0, 0, 0))
        out, self.cache, _ = self.llm.llm.forward_chunk(
            x,
            offset=self.cache.shape[2],
            required_cache_size=-1,
            att_cache=self.cache,
            cnn_cache=empty,
            att_mask=torch.ones((1, 1, 1), dtype=torch.bool),
        )
        return self.llm.llm_decoder(out[:, -1]).log_softmax(dim=-1)


class QwenReference:
    """One row decoded as Qwen2LM.inference does: forward_one_step for the prompt, then per token."""

    def __init__(self, llm, seq):
        from convtts.speak.cosyvoice.engine.runner_qwen import QwenPrompt

        self.llm = llm
        lm_input = QwenPrompt(llm, torch.device("cpu")).embeddings(seq.chunk)
        size = lm_input.shape[1]
        out, self.cache = llm.llm.forward_one_step(lm_input, masks=torch.tril(torch.ones((1, size, size))).bool())
        self.first = llm.llm_decoder(out[:, -1]).log_softmax(dim=-1)

    def step(self, token: int) -> torch.Tensor:
        x = self.llm.speech_embedding.weight[token].reshape(1, 1, -1)
        out, self.cache = self.llm.llm.forward_one_step(x, masks=torch.ones((1, 1, 1)).bool(), cache=self.cache)
        return self.llm.llm_decoder(out[:, -1]).log_softmax(dim=-1)


def run_against_reference(runner, reference, make_seq, tolerance) -> None:
    """Rows of three prompt lengths in rows 0, 2 and 3 (row 1 empty) step together, each against its own
    reference; after 40 steps the sequence in row 0 ends and a new one takes the row."""
    torch.manual_seed(3)
    seqs = [make_seq(0, 5, 100), make_seq(2, 9, 101), make_seq(3, 14, 102)]
    with torch.inference_mode():
        runner.prepare(4)
        refs = {}
        for seq in seqs:
            refs[seq] = reference(seq)
            torch.testing.assert_close(runner.prefill(seq), refs[seq].first, **tolerance)
        for step in range(STEPS):
            if step == 40:
                seqs[0] = make_seq(0, 7, 103)
                refs[seqs[0]] = reference(seqs[0])
                torch.testing.assert_close(runner.prefill(seqs[0]), refs[seqs[0]].first, **tolerance)
            tokens = torch.randint(0, 100, (len(seqs),)).tolist()
            for seq, token in zip(seqs, tokens):
                seq.tokens.append(token)
            logp = runner.step(seqs)
            for i, (seq, token) in enumerate(zip(seqs, tokens)):
                torch.testing.assert_close(
                    logp[i : i + 1], refs[seq].step(token), **tolerance, msg=f"step {step}, row {seq.row}"
                )


@pytest.mark.slow  # 12 s on 2 cores
def test_v1_static_step_is_upstreams_forward_chunk():
    from convtts.speak.cosyvoice.engine.runner_v1 import TransformerRunner, supports_static

    llm = v1_llm()
    assert supports_static(llm)
    # 64 positions to start with: the first prefill grows the cache (its decode bound needs more)
    runner = TransformerRunner(llm, torch.device("cpu"), "fp32", DecodeOptions(row_tokens=64))
    run_against_reference(runner, functools.partial(V1Reference, llm), sequence, FP32)
    assert runner.cache.capacity == 256  # grown: a 14-token prompt and 200 tokens of decode bound


def test_qwen_static_step_is_the_backbones_decode_step(qwen_dir):
    from convtts.speak.cosyvoice.engine.runner_qwen import QwenRunner, supports_static

    llm = qwen_llm(qwen_dir)
    assert supports_static(llm)
    runner = QwenRunner(llm, torch.device("cpu"), "fp32", DecodeOptions(row_tokens=64))
    run_against_reference(runner, functools.partial(QwenReference, llm), functools.partial(sequence, v1=False), FP32)


def test_upstream_runners_are_upstreams_steps(qwen_dir):
    """The padded path (upstream's own layers, rows in one left-padded cache) against the same references."""
    from convtts.speak.cosyvoice.engine.runner_qwen import UpstreamQwenRunner
    from convtts.speak.cosyvoice.engine.runner_v1 import UpstreamTransformerRunner

    for cls, llm, reference, make_seq in (
        (UpstreamTransformerRunner, v1_llm(), V1Reference, sequence),
        (UpstreamQwenRunner, qwen_llm(qwen_dir), QwenReference, functools.partial(sequence, v1=False)),
    ):
        runner = cls(llm, torch.device("cpu"), "fp32", DecodeOptions(decode="upstream"))
        seqs = [make_seq(0, 5, 100), make_seq(1, 12, 101)]
        with torch.inference_mode():
            runner.prepare(2)
            refs = {seq: reference(llm, seq) for seq in seqs}
            for seq in seqs:
                torch.testing.assert_close(runner.prefill(seq), refs[seq].first, **FP32)
            for step in range(20):
                for seq in seqs:
                    seq.tokens.append(step + 1)
                logp = runner.step(seqs)
                for i, seq in enumerate(seqs):
                    torch.testing.assert_close(logp[i : i + 1], refs[seq].step(step + 1), **FP32)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("family", ["v1", "qwen"])
def test_a_half_precision_step_stays_near_fp32(family, precision, qwen_dir):
    """bf16 or fp16 weights (logits in fp32) against fp32, teacher-forced on the same tokens."""
    from convtts.speak.cosyvoice.engine.runner_qwen import QwenRunner
    from convtts.speak.cosyvoice.engine.runner_v1 import TransformerRunner

    make = (lambda: v1_llm()) if family == "v1" else (lambda: qwen_llm(qwen_dir))
    cls = TransformerRunner if family == "v1" else QwenRunner
    make_seq = sequence if family == "v1" else functools.partial(sequence, v1=False)
    exact, half = (
        cls(make(), torch.device("cpu"), "fp32", DecodeOptions()),
        cls(make(), torch.device("cpu"), precision, DecodeOptions()),
    )
    assert half.casts and half.cache is None and next(half.llm.llm.parameters()).dtype == DTYPES[precision]
    assert half.llm.llm_decoder.weight.dtype == torch.float32
    worst = 0.0
    with torch.inference_mode():
        pairs = []
        for runner in (exact, half):
            runner.prepare(2)
            pairs.append([make_seq(0, 6, 200), make_seq(1, 11, 201)])
            for seq in pairs[-1]:
                runner.prefill(seq)
        for step in range(30):
            logps = []
            for runner, seqs in zip((exact, half), pairs):
                for seq in seqs:
                    seq.tokens.append(step * 3 + 1)
                logps.append(runner.step(seqs))
            assert logps[1].dtype == torch.float32
            worst = max(worst, float((logps[0] - logps[1]).abs().max()))
            torch.testing.assert_close(logps[1], logps[0], **HALF[precision])
    assert worst > 0  # the cast did change the numbers


def test_a_bigger_bucket_gives_the_same_rows():
    """What graphs rely on: a step over more rows (dead rows) and more positions changes no live row."""
    from convtts.speak.cosyvoice.engine.runner_v1 import TransformerRunner

    llm = v1_llm()
    runner = TransformerRunner(llm, torch.device("cpu"), "fp32", DecodeOptions(row_tokens=512))
    with torch.inference_mode():
        runner.prepare(8)
        seqs = [sequence(0, 5, 300), sequence(1, 9, 301)]
        for seq in seqs:
            runner.prefill(seq)
            runner.cache.tokens[seq.row] = 17
        lengths = runner.cache.lengths.clone()
        runner.run_step(2, 128)
        small = runner.logps[:2].clone()
        runner.cache.lengths.copy_(lengths)
        runner.run_step(8, 512)
        torch.testing.assert_close(runner.logps[:2], small, **FP32)
        assert runner.cache.lengths[:2].tolist() == [int(n) + 1 for n in lengths[:2]]


def test_buckets():
    assert row_buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    assert row_buckets(12) == [1, 2, 4, 8, 12] and row_buckets(1) == [1] and row_buckets(4) == [1, 2, 4]
    assert [row_bucket(n, 32) for n in (1, 3, 5, 9, 17, 32)] == [1, 4, 8, 16, 24, 32]
    assert [length_bucket(n, 1000) for n in (1, 128, 129, 999)] == [128, 128, 256, 1000]


@pytest.mark.slow  # torch.compile: 13 s on 2 cores
def test_the_compiled_step_is_the_eager_step():
    """torch.compile's kernels for the static step (what the GPU graphs capture when compile is on)."""
    from torch._dynamo.utils import counters

    from convtts.speak.cosyvoice.engine.runner_v1 import TransformerRunner

    llm = v1_llm(blocks=2)
    eager = TransformerRunner(llm, torch.device("cpu"), "fp32", DecodeOptions(row_tokens=512))
    compiled = TransformerRunner(llm, torch.device("cpu"), "fp32", DecodeOptions(row_tokens=512, compile=True))
    counters.clear()
    with torch.inference_mode():
        pairs = []
        for runner in (eager, compiled):
            runner.prepare(4)
            pairs.append([sequence(0, 5, 400), sequence(2, 9, 401)])
            for seq in pairs[-1]:
                runner.prefill(seq)
        for step in range(140):  # two length buckets
            logps = []
            for runner, seqs in zip((eager, compiled), pairs):
                for seq in seqs:
                    seq.tokens.append(step % 50)
                logps.append(runner.step(seqs))
            torch.testing.assert_close(logps[1], logps[0], **FP32)
    assert counters["stats"]["unique_graphs"] >= 1  # it did compile


def v1_chunk_kinds(row_ids: list[int], text_tokens: list[int], kinds: list[str]) -> list[Sequence]:
    """v1 chunks as its frontends make them: sft and cross-lingual (a speaker embedding), zero-shot (also a
    prompt's text and speech tokens), instruct (the instruction as prompt text, no speaker embedding)."""
    seqs = []
    for row, tokens, kind in zip(row_ids, text_tokens, kinds):
        seq = sequence(row, tokens, 500 + row)
        generator = torch.Generator().manual_seed(600 + row)
        if kind in ("zero_shot", "instruct"):
            seq.chunk["prompt_text"] = torch.randint(0, 250, (1, 6), generator=generator, dtype=torch.int32)
        if kind == "zero_shot":
            seq.chunk["llm_prompt_speech_token"] = torch.randint(0, 100, (1, 9), generator=generator, dtype=torch.int32)
        elif kind == "instruct":
            del seq.chunk["llm_embedding"]
        seqs.append(seq)
    return seqs


def prefilled_both_ways(one, many, alone: list[Sequence], together: list[Sequence]) -> None:
    """`alone` prefilled one at a time by `one`, `together` in one forward of `many`: each row gets the keys,
    values, length and first log-probabilities of its own prefill, and decodes on as it would alone."""
    forwards = []
    prompts = many.prompts
    many.prompts = lambda seqs: forwards.append(len(seqs)) or prompts(seqs)
    with torch.inference_mode():
        one.prepare(8)
        many.prepare(8)
        first = [one.prefill(seq) for seq in alone]
        assert many.groups(together) == [together]
        batched = many.prefill_many(together)
        assert forwards == [len(together)]  # one forward for them all
        for a, b, logp_a, logp_b in zip(alone, together, first, batched):
            n = a.prompt_len
            assert b.prompt_len == n == many.prompt_length(b) and int(many.cache.lengths[b.row]) == n
            assert b.launched == 0
            torch.testing.assert_close(logp_b, logp_a, **FP32)
            torch.testing.assert_close(many.cache.k[:, b.row, :, :n], one.cache.k[:, a.row, :, :n], **FP32)
            torch.testing.assert_close(many.cache.v[:, b.row, :, :n], one.cache.v[:, a.row, :, :n], **FP32)
        for step in range(3):
            for a, b in zip(alone, together):
                a.tokens.append(step + 20)
                b.tokens.append(step + 20)
            torch.testing.assert_close(many.step(together), one.step(alone), **FP32)


def test_v1_chunks_prefill_together_as_one_at_a_time():
    """One padded forward for chunks of different lengths and kinds: each row gets the keys, values, length and
    first log-probabilities that its own prefill (upstream's forward_chunk) gives, and decodes on as it would."""
    from convtts.speak.cosyvoice.engine.runner_v1 import TransformerRunner, v1_prompt_length

    llm = v1_llm()
    row_ids, tokens = [0, 2, 3, 5, 6], [5, 12, 3, 17, 4]
    kinds = ["sft", "zero_shot", "instruct", "sft", "zero_shot"]
    alone, together = (v1_chunk_kinds(row_ids, tokens, kinds) for _ in range(2))
    one, many = (TransformerRunner(llm, torch.device("cpu"), "fp32", DecodeOptions(row_tokens=64)) for _ in range(2))
    prefilled_both_ways(one, many, alone, together)
    assert many.cache.capacity == one.cache.capacity == 256
    assert [seq.prompt_len for seq in together] == [v1_prompt_length(seq.chunk) for seq in together]


def qwen_chunk_kinds(row_ids: list[int], text_tokens: list[int], prompt_tokens: list[int]) -> list[Sequence]:
    """v2 chunks of zero-shot voices: a prompt's text and its speech tokens (none for a row without a prompt)."""
    seqs = []
    for row, tokens, speech in zip(row_ids, text_tokens, prompt_tokens):
        seq = sequence(row, tokens, 700 + row, v1=False)
        generator = torch.Generator().manual_seed(800 + row)
        seq.chunk["prompt_text"] = torch.randint(0, 250, (1, 3 + row), generator=generator, dtype=torch.int32)
        seq.chunk["llm_prompt_speech_token"] = torch.randint(
            0, 100, (1, speech), generator=generator, dtype=torch.int32
        )
        seqs.append(seq)
    return seqs


def test_qwen_chunks_prefill_together_as_one_at_a_time(qwen_dir):
    """v2/v3: prompts of different lengths padded on the right in one forward, each row as its own prefill."""
    from convtts.speak.cosyvoice.engine.runner_qwen import QwenRunner

    llm = qwen_llm(qwen_dir)
    row_ids, tokens, speech = [0, 2, 3, 5], [5, 12, 3, 17], [9, 0, 20, 4]
    alone, together = (qwen_chunk_kinds(row_ids, tokens, speech) for _ in range(2))
    one, many = (QwenRunner(llm, torch.device("cpu"), "fp32", DecodeOptions(row_tokens=64)) for _ in range(2))
    prefilled_both_ways(one, many, alone, together)


def test_prefill_groups_are_bounded():
    """At most PREFILL_ROWS chunks a group, and rows x positions^2 within PREFILL_AREA; the other runners
    prefill one chunk at a time."""
    from convtts.speak.cosyvoice.engine.runner import PREFILL_AREA, PREFILL_ROWS
    from convtts.speak.cosyvoice.engine.runner_qwen import QwenRunner
    from convtts.speak.cosyvoice.engine.runner_v1 import TransformerRunner, UpstreamTransformerRunner

    runner = TransformerRunner(v1_llm(blocks=1), torch.device("cpu"), "fp32", DecodeOptions())
    short = [sequence(row, 5, row) for row in range(PREFILL_ROWS + 3)]
    assert [len(group) for group in runner.groups(short)] == [PREFILL_ROWS, 3]
    side = 1024  # prompts of 1024 positions: sos, speaker, 1021 text tokens, task
    rows = PREFILL_AREA // side**2
    long = [sequence(row, side - 3, row) for row in range(rows + 1)]
    assert runner.prompt_length(long[0]) == side
    assert [len(group) for group in runner.groups(long)] == [rows, 1]
    mixed = short[: rows - 1] + long[:1] + short[rows - 1 : rows]  # a long one counts for every row of its group
    assert [len(group) for group in runner.groups(mixed)] == [rows, 1]
    grouped = runner.groups(short + long)
    assert [seq for group in grouped for seq in group] == short + long  # admission order
    assert not UpstreamTransformerRunner.batched and QwenRunner.batched
    upstream = UpstreamTransformerRunner(v1_llm(blocks=1), torch.device("cpu"), "fp32", DecodeOptions())
    assert upstream.groups(short[:3]) == [[seq] for seq in short[:3]]
