"""The quality gate's GPU recogniser (hf-whisper) on the CPU: a tiny random Whisper of the real architecture.

convtts.testing.whisper_model writes the checkpoint directory (config, weights, generation config,
tokenizer and feature extractor, as released) offline; transformers loads it as it would
whisper-large-v3-turbo. Its transcripts are random words, so these tests check the plumbing and the
batching (the same transcripts as transformers' own generate() one take at a time), not accuracy.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from conftest import read_jsonl, run_all, script_env, write_input
from convtts.config import ConfigError, load_config
from convtts.gate.quality import QualityFailure, Take, open_gate, split_heard, take_seed
from convtts.gate.whisper import RATE, WINDOW, TransformersWhisper, pack_takes, token_limit
from convtts.testing.whisper_model import build_whisper_dir

BASE_SEED = 1234  # workers.seed's default
CONVERSATIONS = [  # six segments, each long enough for the ASR check
    {
        "id": "street",
        "conversations": [
            {"from": "human", "value": "What is the man holding in his left hand?"},
            {"from": "gpt", "value": "He is holding a small red umbrella and a newspaper."},
            {"from": "human", "value": "Where is he standing right now?"},
            {"from": "gpt", "value": "He is standing at a bus stop near the park."},
        ],
    },
    {
        "id": "garage",
        "conversations": [
            {"from": "human", "value": "How many bicycles are hanging on the wall?"},
            {"from": "gpt", "value": "There are three bicycles hanging on the wall."},
        ],
    },
]


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return build_whisper_dir(tmp_path_factory.mktemp("whisper") / "tiny", "tiny")


def gate_config(whisper_dir, *extra):
    return load_config(
        None, ["validate.enabled=true", "validate.recogniser=hf-whisper", f"validate.model_path={whisper_dir}", *extra]
    ).validate


@pytest.fixture(scope="module")
def recogniser(whisper_dir):
    """The default decoder, over static buffers (gate/whisper_static.py); the last tests check it against the other."""
    return TransformersWhisper(gate_config(whisper_dir, "validate.asr_batch=3"))


def noise(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(RATE * seconds)) * 0.1).astype(np.float32)


def one_at_a_time(recogniser, audio: np.ndarray, language: str = "en") -> str:
    """transformers' own Whisper generate() on one take (window by window), bounded as the gate bounds it."""
    texts = []
    for start in range(0, len(audio), WINDOW):
        window = audio[start : start + WINDOW]
        features = recogniser.features(window, sampling_rate=RATE, return_tensors="pt").input_features
        tokens = recogniser.model.generate(
            features, language=language, task="transcribe", max_new_tokens=token_limit(len(window), recogniser.room)
        )
        texts.append(recogniser.tokenizer.batch_decode(tokens, skip_special_tokens=True)[0].strip())
    return " ".join(texts)


def test_batched_transcripts_are_generates_one_at_a_time(recogniser):
    """Seven takes of 0.6 to 9 s and one of 34 s (two windows), three rows at a time: every row of
    every batch says what transformers' generate() says for its take alone, and no two takes alike."""
    takes = [noise(seconds, seed) for seed, seconds in enumerate((2.0, 0.6, 5.5, 9.0, 1.2, 3.3, 7.1, 34.0))]
    batched = recogniser.transcribe_many(takes)
    assert batched == [one_at_a_time(recogniser, take) for take in takes]
    assert len(set(batched)) == len(takes) and all(batched)
    assert recogniser.transcribe(takes[2]) == batched[2]


def test_takes_are_heard_in_their_language_as_generate_hears_them(recogniser, whisper_dir):
    """Told a language, the batched decoder (static buffers, and transformers' cache) says what
    generate(language=...) says for each take alone, and not what it says in English."""
    language = "zh"
    takes = [noise(seconds, seed) for seed, seconds in enumerate((2.0, 0.6, 3.5))]
    expected = [one_at_a_time(recogniser, take, language) for take in takes]
    assert recogniser.transcribe_many(takes, language=language) == expected
    assert expected != [one_at_a_time(recogniser, take) for take in takes]
    cached = TransformersWhisper(gate_config(whisper_dir, "validate.asr_batch=3", "validate.asr_graphs=false"))
    assert cached.transcribe_many(takes, language=language) == expected
    assert recogniser.transcribe_many(takes) == recogniser.transcribe_many(takes, language="en")  # put back
    assert recogniser.hears(language) and not recogniser.hears("xx")


@pytest.mark.parametrize(
    "seconds, windows",
    [
        ([2.5] * 10, [list(range(10))]),  # 10 x 2.5 s and 9 gaps of 0.5 s: 29.5 s, one window
        ([2.5] * 11, [list(range(10)), [10]]),
        ([10, 10, 10], [[0, 1], [2]]),  # 10 + 0.5 + 10 + 0.5 + 10 is over 30 s
        ([29.6, 0.5], [[0], [1]]),
        ([2, 34, 2, 2], [[0], [1], [2, 3]]),  # over 30 s: alone, and the next take opens a new window
        ([30, 1], [[0], [1]]),
    ],
)
def test_takes_are_packed_in_order_into_30_second_windows(seconds, windows):
    assert pack_takes([round(s * RATE) for s in seconds]) == windows


def test_packed_windows_hold_every_take_once_in_order(recogniser):
    """Eleven takes packed into five windows (three a batch): each window's takes follow on from the last
    window's, a take over 30 s is alone in its window, and a take alone in its window is heard as it
    is unpacked (the gap after it and Whisper's own padding are the same silence)."""
    seconds = (2.0, 0.6, 5.5, 9.0, 1.2, 3.3, 7.1, 34.0, 20.0, 12.0, 2.5)
    takes = [noise(s, seed) for seed, s in enumerate(seconds)]
    packed = recogniser.transcribe_many(takes, pack=True)
    assert [list(window.takes) for window in packed] == pack_takes([len(t) for t in takes])
    assert [n for window in packed for n in window.takes] == list(range(len(takes)))
    assert [list(window.takes) for window in packed] == [[0, 1, 2, 3, 4, 5], [6], [7], [8], [9, 10]]
    assert all(window.text for window in packed)
    unpacked = recogniser.transcribe_many(takes)
    assert [window.text for window in packed[1:4]] == unpacked[6:9]


def test_a_packed_take_is_judged_on_its_own_words(whisper_dir, recogniser):
    """The gate packs three takes into one window and transcribes it for real; the texts are made from
    what the tiny random model hears there (its words are random), so the middle take's text is
    words the window does not hold: that take is refused (WER 1: it was not heard) and re-spoken,
    its neighbours pass with WER 0, each marked with the takes its window held."""
    gate = open_gate(
        gate_config(
            whisper_dir,
            "validate.assume_english=true",
            "validate.max_seconds_per_word=100",
            "validate.min_seconds_per_word=0",
            "validate.max_wer=0.3",
            "validate.asr_pack=true",
        )
    )
    assert gate.packs
    audio = [noise(s, seed) for seed, s in enumerate((2.0, 3.0, 2.5))]
    window = recogniser.transcribe_many(audio, pack=True)
    assert len(window) == 1 and window[0].takes == (0, 1, 2)
    words = window[0].text.split()
    cut = len(words) // 2
    texts = [" ".join(words[:cut]), "Seven purple engines hum quietly.", " ".join(words[cut:])]
    assert split_heard([t.lower().split() for t in texts], [w.lower() for w in words])[1] == []

    verdicts = gate.judge_many([Take(a, RATE, text, f"u{n}") for n, (a, text) in enumerate(zip(audio, texts))])
    bad = verdicts[1]
    assert isinstance(bad, QualityFailure) and bad.check == "wer" and str(bad) == "wer 1 > 0.3"
    assert bad.scores["heard"] == "" and bad.scores["asr_packed"] == 3
    for verdict in (verdicts[0], verdicts[2]):
        assert verdict["wer"] == 0 and verdict["asr_packed"] == 3 and verdict["heard"]
    assert take_seed(BASE_SEED, "u1", 1) != take_seed(BASE_SEED, "u1", 0)  # the re-spoken take's new seed


def test_the_gate_holds_takes_until_they_fill_its_windows(whisper_dir, recogniser):
    """The batched path judges its held takes once they open the asr_batch-th window (packing), or
    once asr_batch of them are held (not packing)."""
    packing = open_gate(gate_config(whisper_dir, "validate.asr_batch=2", "validate.asr_pack=true"))
    assert not packing.batch_full([2.5] * 10) and packing.batch_full([2.5] * 11)
    assert packing.batch_full([40.0]) is False and packing.batch_full([40.0, 1.0])
    alone = open_gate(gate_config(whisper_dir, "validate.asr_batch=2"))  # the default: one take a window
    assert not alone.packs and not alone.batch_full([2.5]) and alone.batch_full([2.5, 2.5])


def test_decoding_is_bounded_by_the_audio_duration(recogniser):
    """A random decoder never says end-of-text: each row stops at its own bound, 7 tokens a second and 10 more."""
    import torch

    takes = [noise(seconds, seed) for seed, seconds in enumerate((0.5, 2.0, 6.0))]
    features = recogniser.features(takes, sampling_rate=RATE, return_tensors="pt").input_features
    limits = [token_limit(len(take), recogniser.room) for take in takes]
    assert limits == [14, 24, 52]
    with torch.inference_mode():
        encoded = recogniser.model.model.encoder(features).last_hidden_state
        tokens = recogniser._decode(encoded, limits)
    assert [len(row) for row in tokens] == limits
    assert token_limit(WINDOW, recogniser.room) == 220 and token_limit(10**9, recogniser.room) == 444


def test_gate_judges_takes_together_with_the_batched_recogniser(whisper_dir, recogniser):
    """judge_many: signal checks per take, one recogniser call for the rest, a verdict per take in order."""
    gate = open_gate(gate_config(whisper_dir, "validate.max_wer=100", "validate.asr_batch=4", "validate.asr_pack=true"))
    assert gate.batch_rows == 4
    text = "There are three bicycles hanging on the wall."
    rate = 22050
    speechlike = [
        np.sin(np.arange(int(rate * s)) * 0.05 * (k + 1)).astype(np.float32) * 0.3
        for k, s in enumerate((2.5, 1.0, 2.8))
    ]
    silent = np.zeros(rate * 3, np.float32)
    verdicts = gate.judge_many(
        [
            Take(speechlike[0], rate, text, "a"),
            Take(silent, rate, text, "b"),
            Take(speechlike[1], rate, "Yes, sure.", "c"),
            Take(speechlike[2], rate, text, "d"),
        ]
    )
    assert isinstance(verdicts[1], QualityFailure) and verdicts[1].check == "silence"
    assert verdicts[2]["asr"] == "skipped: under 3 words"
    for verdict in (verdicts[0], verdicts[3]):
        assert verdict["asr"] == "hf-whisper" and verdict["heard"] and verdict["wer"] > 0.6
        assert verdict["gate_seconds"] > 0
    assert verdicts[0]["heard"] != verdicts[3]["heard"]
    assert verdicts[0]["asr_packed"] == verdicts[3]["asr_packed"] == 2  # a and d shared a window

    strict = dataclasses.replace(gate, cfg=dataclasses.replace(gate.cfg, max_wer=0.6))
    refused = strict.judge_many([Take(speechlike[0], rate, text, "a")])[0]
    assert isinstance(refused, QualityFailure) and refused.check == "wer" and refused.scores["asr"] == "hf-whisper"
    assert "asr_packed" not in refused.scores  # one take is heard alone


@pytest.mark.parametrize(
    "missing, message",
    [
        ("config.json", "missing config.json"),
        ("model.safetensors", "missing model.safetensors"),
        ("vocab.json", "vocab.json or tokenizer.json"),
    ],
)
def test_a_checkpoint_missing_a_file_is_refused_up_front(tmp_path, whisper_dir, missing, message):
    import shutil

    copy = tmp_path / "whisper"
    shutil.copytree(whisper_dir, copy)
    (copy / missing).unlink()
    with pytest.raises(ConfigError, match=re.escape(message)):
        gate_config(copy)
    for bad in (
        "validate.asr_precision=int8",
        "validate.asr_batch=0",
        "validate.asr_device=tpu",
        "validate.asr_pack=2",
    ):
        with pytest.raises(ConfigError, match=re.escape(bad.split("=")[0])):
            gate_config(whisper_dir, bad)


@pytest.mark.e2e
def test_gate_respeaks_bad_takes_on_the_batched_path_with_hf_whisper(tmp_path, whisper_dir):
    """A real run: Piper spoken through synthesize_many, the takes judged in groups by the hf-whisper gate.
    A silent first take is re-spoken with the next seed and kept; an id silent on every take is a
    failure row (validate.on_fail=fail); every kept row carries the recogniser's transcript and WER (max_wer is
    set high: a random Whisper hears random words), and the takes judged together shared windows."""
    source = write_input(tmp_path / "in.json", CONVERSATIONS)
    out = tmp_path / "out"
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--gpus",
        "cpu:1",
        "--workers",
        "1",
        "--log-dir",
        tmp_path / "log",
        "--set",
        "tts.backend=bad_audio_backend:BatchedBadAudioPiper",
        "--set",
        "validate.enabled=true",
        "--set",
        "validate.recogniser=hf-whisper",
        "--set",
        f"validate.model_path={whisper_dir}",
        "--set",
        "validate.max_wer=100",
        "--set",
        "validate.asr_batch=4",
        "--set",
        "validate.max_respeaks=1",
        "--set",
        "validate.asr_pack=true",
        "--set",
        "validate.on_fail=fail",
        env=script_env(CONVTTS_TEST_BAD="street-001-00=silence:1,garage-000-00=silence:all"),
    )
    assert result.returncode == 1, result.stderr
    rows = {r["id"]: r for r in read_jsonl(out / "manifest.jsonl")}
    assert len(rows) == 5 and "garage-000-00" not in rows
    assert rows["street-001-00"]["respoken_for"] == ["silence 1 > 0.6"]
    for uid, row in rows.items():
        assert row["seed"] == take_seed(BASE_SEED, uid, row["respeaks"])
        assert row["quality"]["asr"] == "hf-whisper" and row["quality"]["heard"] and row["quality"]["wer"] > 0
    assert max(row["quality"].get("asr_packed", 0) for row in rows.values()) > 1
    failed = [f for f in read_jsonl(out / "failures.jsonl") if f["status"] == "failed"]
    assert [(f["id"], f["check"], f["respeaks"]) for f in failed] == [("garage-000-00", "silence", 1)]
    logs = "".join(p.read_text() for p in (tmp_path / "log").rglob("*.log"))
    assert "quality gate on (recogniser hf-whisper, 4 windows of packed takes at a time)" in logs
    assert "Whisper from" in logs and "on cpu in float32" in logs


def test_gpu_memory_a_worker_adds_for_its_recogniser(whisper_dir, recogniser):
    """The slot sizes its workers with it: weights at asr_precision from the safetensors headers, plus a
    batch's activations and caches, per window."""
    from convtts.gate.whisper import checkpoint_parameters, recogniser_gpu_mb

    parameters = sum(p.numel() for p in recogniser.model.parameters())
    assert checkpoint_parameters(whisper_dir) == parameters
    # bf16, 1500 frames and 448 tokens: 1 decoder layer of 64, an encoder FFN of 128
    per_window = 2 * 2 * (1500 * (1 * 64 + 128) + 448 * 1 * 64)
    config = gate_config(whisper_dir)
    assert recogniser_gpu_mb(config) == round((parameters * 2 + 16 * per_window) / 2**20)
    assert recogniser_gpu_mb(dataclasses.replace(config, asr_device="cpu")) == 0
    assert recogniser_gpu_mb(dataclasses.replace(config, recogniser="pocketsphinx", model_path="")) == 0


def test_a_take_is_heard_in_its_rows_language_or_the_language_tests(whisper_dir, recogniser):
    """Whisper is told the plan row's language; without one, the language test's (here, rightly,
    Dutch); under validate.assume_english, English. A Chinese take is scored by characters (cer)
    against max_cer, or its language's own limit."""
    from convtts.gate.quality import Gate

    text = "De trein naar Utrecht vertrekt om negen uur vanaf spoor drie."
    audio = (np.sin(np.arange(22050 * 3) * 0.05) * 0.3).astype(np.float32)
    config = gate_config(whisper_dir, "validate.max_wer=100", "validate.max_cer=100")
    gate = Gate(config, recogniser)
    assert gate.judge(audio, 22050, text)["asr_language"] == "nl"
    assert gate.judge(audio, 22050, text, "", "de")["asr_language"] == "de"
    assumed = Gate(dataclasses.replace(config, assume_english=True), recogniser)
    assert assumed.judge(audio, 22050, text, "", "nl")["asr_language"] == "en"
    chinese = "火车九点从三号站台开往乌得勒支。"
    scores = gate.judge(audio, 22050, chinese, "", "zh")
    assert scores["asr_language"] == "zh" and scores["cer"] > 0 and "wer" not in scores
    strict = Gate(dataclasses.replace(config, max_error_by_language={"zh": scores["cer"] / 2}), recogniser)
    with pytest.raises(QualityFailure, match="^cer "):
        strict.judge(audio, 22050, chinese, "", "zh")
    assert strict.judge(audio, 22050, text, "", "nl")["wer"] > 0  # other languages keep max_wer


@pytest.mark.e2e
def test_a_cpu_slot_is_not_asked_for_whisper_on_a_gpu(tmp_path, whisper_dir):
    """validate.asr_device=cuda with --gpus cpu:1: the slot stops before any worker starts (else every
    worker would die loading Whisper), its log says why, and nothing is spoken. (The device is the
    slot's: preprocess cannot know it, so run_all.sh reports a failed slot, exit 1, not 2.)"""
    source = write_input(tmp_path / "in.json", CONVERSATIONS[1:])
    result = run_all(
        "--input",
        source,
        "--output-dir",
        tmp_path / "out",
        "--gpus",
        "cpu:1",
        "--log-dir",
        tmp_path / "log",
        "--set",
        "validate.enabled=true",
        "--set",
        "validate.recogniser=hf-whisper",
        "--set",
        f"validate.model_path={whisper_dir}",
        "--set",
        "validate.asr_device=cuda",
    )
    assert result.returncode == 1 and "slot 0 (cpu) exited 2" in result.stderr
    slot_log = next((tmp_path / "log").rglob("slot-0.log")).read_text()
    assert "validate.asr_device=cuda, but this slot runs on the CPU" in slot_log and "worker" not in slot_log
    assert not (tmp_path / "out" / "audio").exists()


def test_the_static_decoder_draws_transformers_tokens_row_for_row(whisper_dir):
    """Batches of 1, 3 and 2 windows through buffers sized for 4 (padding rows, a bucket reused after
    a larger batch left its keys behind): each row's tokens are those of transformers' cached decoding."""
    static = TransformersWhisper(gate_config(whisper_dir, "validate.asr_batch=4"))
    assert static.static is not None  # the default
    for seeds, seconds in (((0,), (2.0,)), ((1, 2, 3), (9.0, 0.6, 4.0)), ((4, 5), (3.0, 1.5))):
        audio = [noise(length, seed) for seed, length in zip(seeds, seconds)]
        limits = [token_limit(len(take), static.room) for take in audio]
        encoded = static._encode(static._features(audio))
        assert static.static.decode(encoded, limits) == static._decode_cached(encoded, limits)
        assert all(len(row) for row in static.static.decode(encoded, limits))


def test_without_graphs_the_recogniser_decodes_over_transformers_cache(whisper_dir):
    """validate.asr_graphs=false: transformers' own cached decoding, the same transcripts."""
    cached = TransformersWhisper(gate_config(whisper_dir, "validate.asr_batch=3", "validate.asr_graphs=false"))
    static = TransformersWhisper(gate_config(whisper_dir, "validate.asr_batch=3"))
    takes = [noise(seconds, seed) for seed, seconds in enumerate((2.0, 0.6, 5.5, 3.3))]
    assert cached.static is None
    assert cached.transcribe_many(takes) == static.transcribe_many(takes)
    assert cached.transcribe_many(takes, pack=True) == static.transcribe_many(takes, pack=True)
