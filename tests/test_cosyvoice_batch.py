"""The batched CosyVoice engine against upstream's own one-at-a-time path, on a tiny random v1 model (CPU)."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import REPO, peak_rows, run_short_of_memory, speak_with_two_refused
from convtts.config import (
    Config,
    CosyVoiceConfig,
    FlowConfig,
    PrecisionConfig,
    SpeakerConfig,
    TextConfig,
    TTSConfig,
)
from convtts.speak.base import OutOfMemory
from convtts.speak.cosyvoice.backend import CosyVoiceBackend
from convtts.speak.cosyvoice.engine.engine import BatchEngine
from convtts.speak.cosyvoice.engine.requests import Request
from convtts.speak.cosyvoice.engine.runner import DecodeOptions
from convtts.testing.cosyvoice_model import build_model_dir
from convtts.testing.cosyvoice_v1 import expected_samples, text_token_counts

pytestmark = pytest.mark.cosyvoice

RATIO = 4  # speech tokens per text token
VOICES = ("英文女", "英文男")
TEXTS = [
    "The weather was lovely this morning.",
    "We walked to the harbour and watched the boats come in, one after another, until the sun went down.",
    "A cat sat on the mat.",
    "It weighs 3.5 kilograms and costs twelve dollars.",
    "Yes.",
    "The second sentence is here. And a third one follows it, a little longer than the others.",
]
OCR_LIST = (
    "CALORIECOLA, ZERO, CALORIECOLA, COLA, oZ(222mL), OZ(222mL), 1.5FLOZ, 222mL), oca-Col, Coca, "
    "FocaCol, caCo, zero, zera, REALLOSTE, REAL, ANDZERO, REALConK.TASTE, CALORE, ALConClTASTE, TASTE."
)
# Of full scale, a batched row against upstream's rendering of it alone, both in fp32 (tf32 is fp32
# on a CPU): the same arithmetic on the same values, summed in another order (a kernel's blocking and
# vector width follow the pass's rows and frames, and the CPU). fp32 rounds each result to u = 2**-24
# (6e-8) of its size; a reordered sum of n terms moves by about sqrt(n) u (n u at worst), and the
# largest sums of these passes are n ~ 1e3 (channels x kernel, frames in attention): 2e-6 a layer,
# full scale 1. 1e-5 is 170 u. Measured: 1.0e-7 (AVX-512 MKL, and under AVX2 kernels); what padding
# or a neighbour leaks into a row is 1e-3 and more (1.1e-2 when the group norms took their statistics
# over padded frames).
TOLERANCE = 1e-5


def config(model_dir, batch_size: int, **cosyvoice) -> Config:
    cosy = CosyVoiceConfig(model_dir=str(model_dir), batch_size=batch_size, **cosyvoice)
    return Config(
        speakers=SpeakerConfig(voices=VOICES, policy="single"), tts=TTSConfig(backend="cosyvoice", cosyvoice=cosy)
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("cvb") / "tiny", "tiny", VOICES, tokens_per_text_token=RATIO)


@pytest.fixture(scope="module")
def solo(model_dir):
    backend = CosyVoiceBackend(config(model_dir, 1))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def batched(model_dir):
    backend = CosyVoiceBackend(config(model_dir, 4))
    yield backend
    backend.close()


def items(texts=TEXTS, speaker="英文女"):
    return [(i, text, speaker, 1000 + i) for i, text in enumerate(texts)]


@pytest.mark.parametrize("decode", ["static", "upstream"])
def test_a_batch_of_one_is_the_unbatched_path_sample_for_sample(solo, decode):
    """Either decode path, in fp32 with the exact sampler: upstream's samples, to the last bit."""
    solo.engine = BatchEngine(solo.model, 1, options=DecodeOptions(decode=decode))
    assert solo.engine.runner.static == (decode == "static")
    try:
        results = dict(solo.synthesize_many(items()))
    finally:
        solo.engine = None
    for i, text in enumerate(TEXTS):
        np.testing.assert_array_equal(results[i], solo.synthesize(text, "英文女", 1000 + i))


def test_a_batch_speaks_each_utterance_as_it_would_alone(solo, batched):
    assert batched.batch_rows == 4  # six utterances through four rows: rows are refilled as others finish
    results = dict(batched.synthesize_many(items()))
    assert sorted(results) == list(range(len(TEXTS)))
    for i, text in enumerate(TEXTS):
        audio = results[i]
        assert len(audio) == expected_samples(text_token_counts(batched.model.frontend, text), RATIO), text
        assert np.abs(audio - solo.synthesize(text, "英文女", 1000 + i)).max() < TOLERANCE, text


def test_short_rows_are_spoken_while_long_ones_still_decode(model_dir):
    """Once nothing is left to take a freed row, the decoded rows go through the flow as soon as they
    are as many as the rows still decoding: the short ones are not held until the long ones end."""
    backend = CosyVoiceBackend(config(model_dir, 8))  # a flow pass is due at 4 decoded rows
    steps = []
    step = backend.engine._step
    backend.engine._step = lambda: steps.append(1) or step()
    short, long = ["Yes.", "A cat sat.", "Hi there."], [TEXTS[1]] * 3
    try:
        spoken_at = {key: len(steps) for key, _ in backend.synthesize_many(items(short + long))}
    finally:
        backend.close()
    assert len(spoken_at) == 6
    assert max(spoken_at[k] for k in (0, 1, 2)) < min(spoken_at[k] for k in (3, 4, 5)), spoken_at


def test_the_last_rows_go_through_the_flow_in_wide_passes(solo, model_dir):
    """While input is left, a flush is cut into passes of close lengths (flow.grouping spread); once the
    feed has run dry, each flush is one pass whatever its lengths (flow.tail_spread), and the audio is
    each utterance's own."""
    wide_tail = FlowConfig(grouping="spread", spread=1.0, tail_spread=100.0)  # each length its own pass before the tail
    backend = CosyVoiceBackend(config(model_dir, 4, flow=wide_tail))  # a flush is due at 2 decoded rows
    flushes = []
    groups = backend.engine.audio.flow_pass.groups

    def counted(rows, tail=False):
        passes = groups(rows, tail)
        flushes.append((tail, len({len(row.kept) for row in rows}), len(passes)))
        return passes

    backend.engine.audio.flow_pass.groups = counted
    texts = TEXTS * 2
    try:
        results = dict(backend.synthesize_many(items(texts)))
    finally:
        backend.close()
    fed = [(lengths, passes) for tail, lengths, passes in flushes if not tail]
    last = [(lengths, passes) for tail, lengths, passes in flushes if tail]
    assert fed and all(passes == lengths for lengths, passes in fed), flushes
    assert last and all(passes == 1 for _, passes in last) and max(n for n, _ in last) > 1, flushes
    assert flushes[-1][0] and not flushes[0][0], flushes
    for i, text in enumerate(texts):
        assert np.abs(results[i] - solo.synthesize(text, "英文女", 1000 + i)).max() < TOLERANCE, text


def test_each_call_logs_where_its_time_went(batched, caplog):
    """One line a call: the utterances, the wall time, and the seconds and count of each stage."""
    with caplog.at_level("INFO", logger="convtts.speak.cosyvoice"):
        assert len(dict(batched.synthesize_many(items()))) == len(TEXTS)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine: ")]
    match = re.fullmatch(r"engine: 6 utterances in ([\d.]+) s: (.*)", line)
    assert match, line
    sys.path.insert(0, str(REPO / "bench"))
    from e2e import FLOW_GRAPHS, VOCODER_PASSES, engine_stages  # bench/ is not a package

    summed = engine_stages([line])
    stages, cpu = summed["stage_seconds"], summed["cpu_seconds"]
    assert {"step", "prefill", "flow", "vocoder", "other"} <= set(stages), line
    # each figure is printed to 0.1 s: the stages add up to the wall time within half of that per figure
    # (a full run once printed wall 0.5 against flow 0.3 and four stages of 0.0)
    assert abs(sum(stages.values()) - float(match[1])) <= 0.05 * (len(stages) + 1) + 1e-9, line
    # the loop thread's CPU in each stage: every timed stage has one, none over its wall time (to rounding;
    # torch's own threads are not the loop's)
    assert set(cpu) == set(stages) - {"other"} and cpu["flow"] > 0, line
    assert all(cpu[name] <= stages[name] + 0.1 for name in cpu), line
    # and the frontend thread's, beside it: every text went through it
    [frontend] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("frontend: ")]
    assert engine_stages([frontend])["frontend"]["texts"] == len(TEXTS), frontend
    # the flow's passes on the GPU (none on a CPU), in the words bench/e2e.py sums
    # and the vocoder's passes, with those of one row (upstream's own call)
    passes = re.search(
        r"; flow passes 0 bucketed: 0 replayed, 0 captured; vocoder passes (\d+), (\d+) of one row$", line
    )
    assert passes and 1 <= int(passes[1]) <= len(TEXTS) and int(passes[2]) <= int(passes[1]), line
    assert FLOW_GRAPHS.search(line).groups() == ("0", "0", "0"), line
    assert VOCODER_PASSES.search(line).groups() == passes.groups(), line


def test_each_utterance_has_its_own_seed(batched):
    twice = dict(
        batched.synthesize_many([(0, TEXTS[0], "英文女", 7), (1, TEXTS[0], "英文女", 8), (2, TEXTS[0], "英文女", 7)])
    )
    assert np.abs(twice[0] - twice[2]).max() < TOLERANCE
    assert np.abs(twice[0] - twice[1]).max() > 0.01


def test_one_failing_utterance_fails_alone(solo, batched):
    results = speak_with_two_refused(batched, TEXTS, "英文女")
    for i in (0, 1, 3, 5):
        assert np.abs(results[i] - solo.synthesize(TEXTS[i], "英文女", 1000 + i)).max() < TOLERANCE


def test_a_feed_that_says_wait_is_asked_again_and_loses_nothing(batched):
    """FEED_WAIT from the feed (a worker holding its first batch) stops the engine taking more for now, not
    for good: it steps on, asks again, and speaks what comes after; nothing comes back before the wait's end
    but what was given before it."""
    from convtts.speak.base import FEED_WAIT

    back, waits = [], 0

    def feed():
        nonlocal waits
        yield from items()[:2]
        while not back:
            waits += 1
            yield FEED_WAIT
        yield from items()[2:]

    for key, audio in batched.synthesize_many(feed()):
        assert back or key in (0, 1)
        assert audio.size
        back.append(key)
    assert sorted(back) == list(range(len(TEXTS))) and waits > 1


def test_out_of_memory_leaves_the_unfinished_to_the_caller(batched, monkeypatch):
    run_short_of_memory(monkeypatch, BatchEngine, rows=2)
    given = []

    def feed():
        for item in items():
            given.append(item[0])
            yield item

    finished = {}
    with pytest.raises(OutOfMemory):
        for key, audio in batched.synthesize_many(feed()):
            finished[key] = audio
    assert len(given) >= 3 and not finished  # handed over, none finished: all the caller's to retry
    assert batched.shrink_batch() == 2
    finished = dict(batched.synthesize_many(items()))  # two rows fit
    assert sorted(finished) == list(range(len(TEXTS)))
    assert batched.grow_batch() == 4 and batched.grow_batch() == 4  # back to the rows it was built with, no more
    monkeypatch.undo()
    live = peak_rows(monkeypatch, BatchEngine)
    finished = dict(batched.synthesize_many(items()))
    assert max(live) == 4  # the larger cache is allocated and every row decodes
    assert sorted(finished) == list(range(len(TEXTS)))


def test_batch_size_is_checked_up_front():
    from convtts.config import ConfigError, load_config

    assert load_config(None, ["tts.cosyvoice.batch_size=16"]).tts.cosyvoice.batch_size == 16
    assert load_config(None, ["tts.cosyvoice.batch_size=0"]).tts.cosyvoice.batch_size == 0  # automatic
    for bad in ("-1", "257", "two"):
        with pytest.raises(ConfigError, match="batch_size"):
            load_config(None, [f"tts.cosyvoice.batch_size={bad}"])


def decode(backend, engine, texts=TEXTS) -> dict:
    """Each text's request after the engine spoke them (its audio and the tokens each chunk decoded)."""
    requests = [Request(i, backend._chunks(text, "英文女"), 1000 + i) for i, text in enumerate(texts)]
    return {request.key: request for request in engine.speak(requests)}


def test_the_static_decode_draws_the_tokens_of_the_padded_one(solo):
    """Rows join and leave at different lengths: the static decode and upstream's padded one draw the same tokens."""
    padded = decode(solo, BatchEngine(solo.model, 4, options=DecodeOptions(decode="upstream")))
    static = decode(solo, BatchEngine(solo.model, 4, options=DecodeOptions(decode="static", row_tokens=64)))
    for i in range(len(TEXTS)):
        assert static[i].error is None and static[i].tokens == padded[i].tokens
        np.testing.assert_array_equal(np.concatenate(static[i].audio), np.concatenate(padded[i].audio))


def test_gpu_sampling_draws_a_rows_tokens_whatever_rows_share_its_steps(solo):
    """The GPU sampler's path (the step launched before the last one is read), run on the CPU: each
    utterance draws the same tokens in four rows as alone, though not the exact sampler's tokens."""
    gpu = DecodeOptions(sampler="gpu", row_tokens=64)
    together = decode(solo, BatchEngine(solo.model, 4, options=gpu))
    alone = decode(solo, BatchEngine(solo.model, 1, options=gpu))
    exact = decode(solo, BatchEngine(solo.model, 4))
    assert solo.engine is None and BatchEngine(solo.model, 4, options=gpu).gpu_sampling
    for i, text in enumerate(TEXTS):
        assert together[i].error is None and together[i].tokens == alone[i].tokens, text
        assert [len(t) for t in together[i].tokens] == [len(t) for t in exact[i].tokens]  # as pinned
        audio = np.concatenate(together[i].audio)
        assert len(audio) == expected_samples(text_token_counts(solo.model.frontend, text), RATIO), text
        assert np.abs(audio - np.concatenate(alone[i].audio)).max() < TOLERANCE, text
    assert sum(a.tokens != b.tokens for a, b in zip(together.values(), exact.values())) >= len(TEXTS) - 1


def test_graphs_asked_for_on_the_cpu_run_the_step_eagerly(solo, caplog):
    """CUDA graphs cannot run here: the step they would capture runs as it is, with the same buffers."""
    caplog.set_level("INFO")
    graphed = BatchEngine(solo.model, 4, options=DecodeOptions(cuda_graphs=True, sampler="gpu"))
    eager = BatchEngine(solo.model, 4, options=DecodeOptions(cuda_graphs=False, sampler="gpu"))
    a, b = decode(solo, graphed), decode(solo, eager)
    assert "CUDA graphs asked for on cpu" in caplog.text and not graphed.runner.graphs.graphs
    assert all(a[i].tokens == b[i].tokens for i in range(len(TEXTS)))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_half_precision_llm_speaks_every_utterance(model_dir, precision):
    """The LLM's weights cast (logits in fp32): every utterance at its pinned length; upstream's own path,
    which cannot run cast weights, speaks through the engine instead."""
    backend = CosyVoiceBackend(config(model_dir, 4, precision=PrecisionConfig(llm=precision)))
    try:
        assert backend.engine.casts_llm and backend.engine.llm.llm_decoder.weight.dtype == torch.float32
        results = dict(backend.synthesize_many(items()))
        for i, text in enumerate(TEXTS):
            assert len(results[i]) == expected_samples(text_token_counts(backend.model.frontend, text), RATIO), text
            assert np.isfinite(results[i]).all() and np.abs(results[i]).max() <= 1.0
        alone = backend.synthesize(TEXTS[1], "英文女", 1001)
        assert len(alone) == len(results[1])
    finally:
        backend.close()


def test_decode_settings_are_checked_up_front():
    from convtts.config import ConfigError, load_config

    cosy = load_config(
        None, ["tts.cosyvoice.sampler=gpu", "tts.cosyvoice.compile=true", "tts.cosyvoice.cuda_graphs=false"]
    ).tts.cosyvoice
    assert (cosy.decode, cosy.sampler, cosy.compile, cosy.cuda_graphs) == ("static", "gpu", True, False)
    for bad, message in (
        (["tts.cosyvoice.decode=fast"], "decode must be one of"),
        (["tts.cosyvoice.sampler=tpu"], "sampler must be one of"),
        (["tts.cosyvoice.decode=upstream", "tts.cosyvoice.sampler=gpu"], "sampler=gpu needs"),
        (["tts.cosyvoice.decode=upstream", "tts.cosyvoice.compile=true"], "compile needs"),
        (["tts.cosyvoice.cuda_graphs=yes please"], "cuda_graphs must be true or false"),
        (["tts.cosyvoice.max_row_tokens=-5"], "max_row_tokens"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config(None, bad)


def prefill_forwards(engine) -> list[int]:
    """The number of chunks in each batched prefill the engine's runner makes from now on."""
    sizes = []
    prompts = engine.runner.prompts
    engine.runner.prompts = lambda seqs: sizes.append(len(seqs)) or prompts(seqs)
    return sizes


@pytest.mark.parametrize("sampler", ["cpu", "gpu"])
def test_rows_admitted_together_prefill_in_one_forward(solo, sampler):
    """The first four rows prefill in one padded forward: each utterance draws the tokens, and gets the audio,
    of one prefill per chunk."""
    options = DecodeOptions(sampler=sampler, row_tokens=64)
    together, one_by_one = BatchEngine(solo.model, 4, options=options), BatchEngine(solo.model, 4, options=options)
    one_by_one.runner.batched = False
    sizes = prefill_forwards(together)
    batched, alone = decode(solo, together), decode(solo, one_by_one)
    assert sizes[0] == 4, sizes
    for i in range(len(TEXTS)):
        assert batched[i].error is None and batched[i].tokens == alone[i].tokens, TEXTS[i]
        np.testing.assert_array_equal(np.concatenate(batched[i].audio), np.concatenate(alone[i].audio))


def test_a_chunk_whose_prefill_fails_fails_alone(solo, caplog):
    """One bad chunk fails its group's forward: the group's chunks prefill again one at a time, and only the bad
    one's utterance fails; the others speak as in a run without it."""
    engine = BatchEngine(solo.model, 4, options=DecodeOptions(row_tokens=64))
    sizes = prefill_forwards(engine)
    requests = [Request(i, solo._chunks(text, "英文女"), 1000 + i) for i, text in enumerate(TEXTS)]
    bad = requests[1].chunks[0]
    bad["text"] = torch.full_like(bad["text"], 10**6)  # past the text embedding's rows: not a memory error
    with caplog.at_level("WARNING", logger="convtts.speak.cosyvoice.engine.engine"):
        spoken = {request.key: request for request in engine.speak(requests)}
    assert sizes[0] == 4 and "4 chunks failed to prefill together (IndexError" in caplog.text
    assert isinstance(spoken[1].error, IndexError)
    clean = decode(solo, BatchEngine(solo.model, 4, options=DecodeOptions(row_tokens=64)))
    for i in (0, 2, 3, 4, 5):
        assert spoken[i].error is None and spoken[i].tokens == clean[i].tokens, TEXTS[i]


def test_a_text_the_frontend_breaks_on_is_spoken_as_written(model_dir, caplog):
    """Some runtime releases raise IndexError in split_paragraph on OCR-token lists (an empty sentence after
    normalisation): the utterance is spoken without the runtime's normalisation, with a warning naming where
    it broke, instead of failing on every rerun; the other texts keep theirs."""
    backend = CosyVoiceBackend(config(model_dir, 4))
    frontend = backend.model.frontend
    normalize = frontend.text_normalize

    def breaks_on_ocr(text, split=True, text_frontend=True):
        if text_frontend and "OCR" in text:
            return ""[-1]  # the runtime's own failure: indexing an empty string
        return normalize(text, split=split, text_frontend=text_frontend)

    frontend.text_normalize = breaks_on_ocr
    texts = ["Reference OCR token: MARINERS, sato.", TEXTS[0]]
    try:
        with caplog.at_level("WARNING", logger="convtts.speak.cosyvoice.text_frontend"):
            results = dict(backend.synthesize_many(items(texts)))
    finally:
        backend.close()
    assert all(isinstance(audio, np.ndarray) and audio.size for audio in results.values()), results
    [warning] = [r.getMessage() for r in caplog.records if "text frontend failed" in r.getMessage()]
    assert "IndexError" in warning and "speaking it as written" in warning and "MARINERS" in warning, warning


def test_a_chunk_over_the_text_tokens_a_row_was_sized_for_is_cut_and_the_cache_keeps_its_size(model_dir, caplog):
    """An OCR-token list holds far more text tokens a word than the KV plan allows (2 a word): its chunk
    is cut into pieces within the plan, spoken in turn, and no row's cache grows for it."""
    text = OCR_LIST
    cfg = dataclasses.replace(config(model_dir, 4), text=TextConfig(max_words=12))  # 32 text tokens a chunk
    backend = CosyVoiceBackend(cfg)
    try:
        count = backend.model.frontend.tokenizer.encode
        chunks = backend._chunks(text, VOICES[0])
        with caplog.at_level("INFO", logger="convtts.speak.cosyvoice.engine.runner"):
            results = dict(backend.synthesize_many(items([text, TEXTS[0]])))
    finally:
        backend.close()
    assert backend.text_budget == 32 and len(count(text, allowed_special="all")) > 2 * 32
    assert len(chunks) >= 3 and all(chunk["text"].shape[1] <= 32 for chunk in chunks), [
        chunk["text"].shape[1] for chunk in chunks
    ]
    assert all(isinstance(audio, np.ndarray) and audio.size for audio in results.values()), results
    assert not [r for r in caplog.records if "cache grows" in r.getMessage()]


def widest_text(engine) -> list[int]:
    """Filled in as `engine` decodes: at each step, the most chunks of one text holding rows at once."""
    widths, step = [], engine._step

    def counted():
        widths.append(max(Counter(seq.request.key for seq in engine.rows).values()))
        return step()

    engine._step = counted
    return widths


def test_the_chunks_of_a_text_decode_together_where_their_draws_are_keyed(model_dir):
    """Tokens drawn on the GPU are keyed by utterance and chunk: a text's chunks take rows at once, each
    with a random stream of its own, so a long text takes the time of its longest chunk, and speaks the
    tokens and audio it speaks alone. The exact sampler draws every chunk from the utterance's one
    stream, in upstream's order: its chunks decode one after the other."""
    backend = CosyVoiceBackend(dataclasses.replace(config(model_dir, 4), text=TextConfig(max_words=12)))
    gpu = DecodeOptions(sampler="gpu")
    engines = {
        "together": BatchEngine(backend.model, 4, options=gpu),
        "alone": BatchEngine(backend.model, 1, options=gpu),
        "exact": BatchEngine(backend.model, 4),
    }
    widths = {name: widest_text(engine) for name, engine in engines.items()}
    try:
        spoken = {name: decode(backend, engine, [OCR_LIST, TEXTS[0]]) for name, engine in engines.items()}
    finally:
        backend.close()
    together, alone = spoken["together"], spoken["alone"]
    assert len(together[0].tokens) >= 3 and max(widths["together"]) >= 3, widths["together"]
    assert max(widths["exact"]) == 1 and max(widths["alone"]) == 1
    for key in (0, 1):
        assert together[key].error is None and together[key].tokens == alone[key].tokens
        audio, solo = np.concatenate(together[key].audio), np.concatenate(alone[key].audio)
        assert len(audio) == len(solo) and np.abs(audio - solo).max() < TOLERANCE
    assert [len(t) for t in spoken["exact"][0].tokens] == [len(t) for t in together[0].tokens]  # as pinned
