"""The batched CosyVoice2 engine against upstream's own one-at-a-time path, on a tiny random v2 model (CPU).

A batch of one is upstream's path sample for sample. In a batch, rows draw the same speech tokens
as alone, and rows sharing a flow pass are padded on the right, which causal and masked layers do
not see: measured 1e-7 to 2e-4 of full scale from the solo rendering. CosyVoice3 and the checkout
runtime are covered end to end in test_cosyvoice_v2_v3.py.

"The same tokens" (and a batch of one's samples) hold up to float rounding: the engine's decode
step rounds the log-probabilities otherwise than upstream's (up to 2e-6 apart; 4 rows against 1
too), and the random model's distribution is flat enough that two of the 25 tokens a step draws
among are that close now and then: about one prompt recording in 100 draws one token otherwise,
and its row misses TOLERANCE by far (0.009 seen). So the prompt is spoken by Piper
without its noise: the same recording in every session, the same outcome on one machine (another
CPU's kernels may round otherwise; here its closest draw is 1.4e-5 from a swap, 7x the rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import peak_rows, run_short_of_memory, speak_with_two_refused, steady_recording
from convtts.config import Config, ConfigError, CosyVoiceConfig, PromptVoice, SpeakerConfig, TTSConfig, load_config
from convtts.speak.base import OutOfMemory
from convtts.speak.cosyvoice.backend import CosyVoiceBackend
from convtts.speak.cosyvoice.engine import prefill_qwen
from convtts.speak.cosyvoice.engine.qwen import QwenBatchEngine
from convtts.speak.cosyvoice.engine.requests import Request
from convtts.speak.cosyvoice.engine.runner import DecodeOptions
from convtts.speak.cosyvoice.engine.runner_qwen import cache_tensors
from convtts.testing.cosyvoice_model import build_model_dir
from convtts.testing.cosyvoice_qwen import expected_samples
from convtts.testing.cosyvoice_v1 import text_token_counts

pytestmark = pytest.mark.cosyvoice

RATIO = 3  # speech tokens per text token
# Of full scale, a batched row against upstream's rendering of it alone, in fp32: only the order of
# the sums differs, about sqrt(n) u a layer for sums of n ~ 1e3 terms (u = 2**-24), derived in
# test_cosyvoice_batch.py; 1e-5 is 170 u. Measured: 1.2e-7 (AVX-512 MKL, and under AVX2 kernels).
TOLERANCE = 1e-5
PROMPT = "Hello, this is a short prompt for a new voice."
TEXTS = [
    "The weather was lovely this morning.",
    "We walked to the harbour and watched the boats come in, one after another, until the sun went down.",
    "A cat sat on the mat.",
    "It weighs 3.5 kilograms and costs twelve dollars.",
    "Yes.",
    "The second sentence is here. And a third one follows it, a little longer than the others.",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("cv2b") / "tiny", "tiny", [], tokens_per_text_token=RATIO, version=2)


@pytest.fixture(scope="module")
def prompt(tmp_path_factory):
    # noise off: every noisy recording is a new draw of the ties above
    return steady_recording(tmp_path_factory.mktemp("prompt") / "anna.wav", PROMPT)


def config(model_dir, prompt, batch_size: int) -> Config:
    cosy = CosyVoiceConfig(
        model_dir=str(model_dir), batch_size=batch_size, prompts={"anna": PromptVoice(audio=str(prompt), text=PROMPT)}
    )
    return Config(
        speakers=SpeakerConfig(voices=("anna",), policy="single"), tts=TTSConfig(backend="cosyvoice", cosyvoice=cosy)
    )


@pytest.fixture(scope="module")
def solo(model_dir, prompt):
    backend = CosyVoiceBackend(config(model_dir, prompt, 1))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def batched(model_dir, prompt):
    backend = CosyVoiceBackend(config(model_dir, prompt, 4))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def alone(solo):
    """Each text spoken by upstream's own path (inference_zero_shot), with its seed."""
    return [solo.synthesize(text, "anna", 1000 + i) for i, text in enumerate(TEXTS)]


def items(texts=TEXTS):
    return [(i, text, "anna", 1000 + i) for i, text in enumerate(texts)]


def test_v2_models_get_the_qwen_engine(batched):
    assert isinstance(batched.engine, QwenBatchEngine) and batched.batch_rows == 4


@pytest.mark.parametrize("decode", ["static", "upstream"])
def test_a_batch_of_one_is_the_unbatched_path_sample_for_sample(solo, alone, decode):
    solo.engine = QwenBatchEngine(solo.model, 1, options=DecodeOptions(decode=decode))
    assert solo.engine.runner.static == (decode == "static")
    try:
        results = dict(solo.synthesize_many(items()))
    finally:
        solo.engine = None
    for i in range(len(TEXTS)):
        np.testing.assert_array_equal(results[i], alone[i])


def test_a_batch_speaks_each_utterance_as_it_would_alone(batched, alone):
    # Six utterances through four rows: rows join and leave the shared cache at different
    # lengths, so left padding, masks and positions all matter to the result.
    results = dict(batched.synthesize_many(items()))
    assert sorted(results) == list(range(len(TEXTS)))
    for i, text in enumerate(TEXTS):
        counts = text_token_counts(batched.model.frontend, text)
        assert len(results[i]) == sum(expected_samples(int(n * RATIO)) for n in counts), text
        assert np.abs(results[i] - alone[i]).max() < TOLERANCE, text


def test_upstreams_decode_attends_to_the_whole_cache(solo):
    """The runtime shim: upstream's one-column step mask, widened, equals attention over every cached token."""
    llm = solo.model.model.llm
    prompt = torch.randn(1, 9, llm.llm_input_size)
    step = llm.speech_embedding.weight[[5]].reshape(1, 1, -1)
    with torch.inference_mode():
        _, cache = llm.llm.forward_one_step(prompt, masks=torch.tril(torch.ones(1, 9, 9)).bool())
        upstream, _ = llm.llm.forward_one_step(step, masks=torch.ones(1, 1, 1).bool(), cache=cache)
        whole = torch.cat([prompt, step], dim=1)
        full = llm.llm.model(inputs_embeds=whole, output_hidden_states=True).hidden_states[-1][:, -1:]
    torch.testing.assert_close(upstream, full, rtol=1e-4, atol=1e-5)


def test_one_failing_utterance_fails_alone(batched, alone):
    results = speak_with_two_refused(batched, TEXTS, "anna")
    for i in (0, 1, 3, 5):
        assert np.abs(results[i] - alone[i]).max() < TOLERANCE


def test_out_of_memory_leaves_the_unfinished_to_the_caller(batched, alone, monkeypatch):
    run_short_of_memory(monkeypatch, QwenBatchEngine, rows=2)
    finished = {}
    with pytest.raises(OutOfMemory):
        for key, audio in batched.synthesize_many(items()):
            finished[key] = audio
    assert not finished
    assert batched.shrink_batch() == 2
    finished = dict(batched.synthesize_many(items()))  # two rows fit
    for i in range(len(TEXTS)):
        assert np.abs(finished[i] - alone[i]).max() < TOLERANCE
    assert batched.grow_batch() == 4 and batched.grow_batch() == 4  # back to the rows it was built with, no more
    monkeypatch.undo()
    live = peak_rows(monkeypatch, QwenBatchEngine)
    finished = dict(batched.synthesize_many(items()))
    assert max(live) == 4  # the larger cache is allocated and every row decodes
    for i in range(len(TEXTS)):
        assert np.abs(finished[i] - alone[i]).max() < TOLERANCE


def decode(backend, engine) -> dict:
    requests = [Request(i, backend._chunks(text, "anna"), 1000 + i) for i, text in enumerate(TEXTS)]
    return {request.key: request for request in engine.speak(requests)}


def test_static_and_padded_decodes_draw_the_same_tokens(solo):
    padded = decode(solo, QwenBatchEngine(solo.model, 4, options=DecodeOptions(decode="upstream")))
    static = decode(solo, QwenBatchEngine(solo.model, 4, options=DecodeOptions(decode="static", row_tokens=64)))
    for i in range(len(TEXTS)):
        assert static[i].error is None and static[i].tokens == padded[i].tokens


def test_gpu_sampling_draws_a_rows_tokens_whatever_rows_share_its_steps(solo, alone):
    gpu = DecodeOptions(sampler="gpu")
    together = decode(solo, QwenBatchEngine(solo.model, 4, options=gpu))
    apart = decode(solo, QwenBatchEngine(solo.model, 1, options=gpu))
    for i, text in enumerate(TEXTS):
        assert together[i].error is None and together[i].tokens == apart[i].tokens, text
        assert len(np.concatenate(together[i].audio)) == len(alone[i]), text  # the pinned length
        assert np.abs(np.concatenate(together[i].audio) - np.concatenate(apart[i].audio)).max() < TOLERANCE, text


# -- our own prefill (prefill_qwen; graphed on CUDA, eager here) against the Hugging Face backbone's: in fp32
# the two take the same products in the same order (measured 0.0 apart here); TOLERANCE leaves room for
# kernels that sum otherwise.
def speak_with_prefill(backend, prefill: str, rows: int = 4) -> dict:
    backend.engine = QwenBatchEngine(backend.model, rows, options=DecodeOptions(prefill=prefill))
    try:
        return dict(backend.synthesize_many(items()))
    finally:
        backend.engine = None


@pytest.fixture(scope="module")
def backbone_prefilled(solo):
    return speak_with_prefill(solo, "upstream")


def test_our_prefill_speaks_each_utterance_as_the_backbones_does(solo, backbone_prefilled, monkeypatch):
    groups = []
    run = prefill_qwen.QwenPrefill.run
    monkeypatch.setattr(prefill_qwen.QwenPrefill, "run", lambda self, e: groups.append(len(e)) or run(self, e))
    ours = speak_with_prefill(solo, "static")
    assert max(groups) > 1, groups  # prompts admitted together went through one forward
    assert sorted(ours) == sorted(backbone_prefilled)
    for i, text in enumerate(TEXTS):
        assert len(ours[i]) == len(backbone_prefilled[i]), text
        assert np.abs(ours[i] - backbone_prefilled[i]).max() < TOLERANCE, text


def test_prompts_wider_than_the_graphs_go_through_the_backbone(solo, backbone_prefilled, monkeypatch):
    monkeypatch.setattr(prefill_qwen, "MAX_WIDTH", 64)  # every prompt here is wider
    monkeypatch.setattr(prefill_qwen.QwenPrefill, "run", lambda self, e: pytest.fail("a wide prompt was taken"))
    ours = speak_with_prefill(solo, "static")
    for i in range(len(TEXTS)):
        np.testing.assert_array_equal(ours[i], backbone_prefilled[i])


def test_keys_and_last_states_match_the_backbone_up_to_each_prompts_length(solo):
    engine = QwenBatchEngine(solo.model, 4, options=DecodeOptions(prefill="static"))
    runner = engine.runner
    generator = torch.Generator().manual_seed(0)
    width = runner.builder.backbone.config.hidden_size
    wide = [torch.randn(n, width, generator=generator) for n in (90, 70, 80, 75)]
    embedded = [torch.randn(n, width, generator=generator) for n in (37, 5, 60)]
    with torch.inference_mode():
        runner.prefiller.run(wide)  # then three narrower prompts in the same row bucket, a padding row among them
        bucket = runner.prefiller.run(embedded)
        assert bucket == 64
        for i, e in enumerate(embedded):
            out = runner.builder.backbone(inputs_embeds=e[None], use_cache=True)
            layers = cache_tensors(out.past_key_values)
            torch.testing.assert_close(runner.prefiller.last[i], out.last_hidden_state[0, -1], rtol=0, atol=1e-5)
            for layer in range(len(layers) // 2):
                own = runner.prefiller.keys[layer, i, :, : len(e)], runner.prefiller.values[layer, i, :, : len(e)]
                torch.testing.assert_close(own[0], layers[2 * layer][0], rtol=0, atol=1e-5)
                torch.testing.assert_close(own[1], layers[2 * layer + 1][0], rtol=0, atol=1e-5)


def test_the_prefill_is_upstreams_on_the_cpu_unless_asked_and_refused_when_unknown(solo):
    assert QwenBatchEngine(solo.model, 2).runner.prefiller is None  # auto: our prefill on CUDA only
    assert QwenBatchEngine(solo.model, 2, options=DecodeOptions(prefill="static")).runner.prefiller is not None
    with pytest.raises(ConfigError, match="tts.cosyvoice.prefill must be one of"):
        load_config(None, ["tts.cosyvoice.prefill=graphs"])
