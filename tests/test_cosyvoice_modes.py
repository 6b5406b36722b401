"""Cross-lingual and instruct voices: the batched engine against upstream's own one-at-a-time calls
(inference_cross_lingual, inference_instruct2), on tiny random models of v1, v2 and v3 (CPU, each in a
fresh interpreter: tests/modes_probe.py); and what each mode asks of a voice's config."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from conftest import REPO, assert_complete, run_all, steady_recording, version_env, write_input
from convtts.config import ConfigError, PromptVoice, load_config
from convtts.speak.cosyvoice import check
from convtts.speak.cosyvoice.prompts import V3_SYSTEM_PROMPT, check_voice

END_OF_PROMPT_ID = 151646  # <|endofprompt|> in the Qwen tokenizer of v2 and v3
PROMPT_TEXT = "Hello, this is a short prompt for a new voice."
# Of full scale, a row beside others against upstream's rendering of it alone, in fp32: only the order
# of the sums differs (about sqrt(n) u a layer for sums of n ~ 1e3 terms, u = 2**-24; derived in
# test_cosyvoice_batch.py); 1e-5 is 170 u. Measured: 0 to 1.4e-7 for every mode and version here.
TOLERANCE = 1e-5
CANTONESE = "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"
MODES = [  # (version, mode, instruction)
    (1, "cross_lingual", ""),
    (1, "instruct", "Theo is a calm narrator who speaks slowly."),  # a built-in speaker told it (300M-Instruct)
    (2, "cross_lingual", ""),
    (2, "instruct", "Speak slowly and warmly."),  # cosyvoice2-eu adds the marker itself
    (3, "cross_lingual", ""),
    (3, "instruct", CANTONESE),
]


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return steady_recording(tmp_path_factory.mktemp("prompt") / "anna.wav", PROMPT_TEXT)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny random model directory per version, built on first use."""
    built = {}

    def model(version: int):
        if version not in built:
            # named as released: the installed runtime speaks instruct only from a "-Instruct" directory
            out = tmp_path_factory.mktemp(f"modes-v{version}") / ("tiny-Instruct" if version == 1 else "tiny")
            command = [sys.executable, "-m", "convtts.testing.cosyvoice_model", "--version", str(version)]
            done = subprocess.run(
                [*command, "--out", str(out)], env=version_env(version), capture_output=True, text=True, timeout=600
            )
            assert done.returncode == 0, done.stderr[-3000:]
            built[version] = out
        return built[version]

    return model


@pytest.mark.cosyvoice
@pytest.mark.parametrize(("version", "mode", "instruct"), MODES, ids=[f"v{v}-{m}" for v, m, _ in MODES])
def test_the_batched_engine_speaks_each_mode_as_upstream_does_alone(models, recording, version, mode, instruct):
    env = version_env(version)
    voice = "speaker:英文男" if version == 1 and mode == "instruct" else str(recording)
    command = [sys.executable, str(REPO / "tests" / "modes_probe.py"), str(models(version)), voice, mode]
    done = subprocess.run([*command, instruct], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["version"] == version and all(report["samples"])
    assert report["one_row"] == [0.0] * len(report["samples"])  # an engine of one row is upstream, sample for sample
    assert report["solo"] == [0.0] * len(report["samples"])  # so is our one-at-a-time path on the registered voice
    assert all(d is not None and d < TOLERANCE for d in report["batched"]), report["batched"]
    draws = report["batched_draws"]  # the batched LLM's own draws on upstream's histories and random states
    assert draws["steps"] > 0 and draws["unmatched_chunks"] == 0 and draws["max_tv"] < check.FP32_TV_PASS, draws
    assert draws["steps"] - draws["agree"] <= check.FLIPS_SLACK, draws
    keys = set(report["chunk_keys"])
    assert "llm_prompt_speech_token" not in keys  # neither mode gives the LLM the recording's tokens
    if voice.startswith("speaker:"):  # upstream leaves the speaker's embedding out of the LLM, the flow keeps it
        assert keys == {"text", "text_len", "flow_embedding", "prompt_text", "prompt_text_len"}
        assert report["prompt_text"][: len(report["instruct_tokens"])] == report["instruct_tokens"]
        return
    assert {"flow_prompt_speech_token", "prompt_speech_feat", "flow_embedding"} <= keys  # the flow hears it
    if mode == "cross_lingual":
        assert "prompt_text" not in keys
        marker = report["text"].index(END_OF_PROMPT_ID) if version == 3 else -1
        assert marker > 0 or version < 3  # upstream's system prompt, then the text
    else:  # the instruction in the transcript's place, whatever the release adds to it
        assert report["prompt_text"][: len(report["instruct_tokens"])] == report["instruct_tokens"]
        assert report["prompt_text"][-1] == END_OF_PROMPT_ID


def a_recording(path, seconds: float = 1.0):
    t = np.arange(int(16000 * seconds)) / 16000
    sf.write(path, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    return str(path)


def test_each_mode_asks_only_for_what_it_uses(tmp_path):
    audio = a_recording(tmp_path / "a.wav")
    for version in (1, 2, 3):  # no transcript needed: CosyVoice3 gets upstream's system prompt
        check_voice("v", PromptVoice(audio, mode="cross_lingual"), version)
    check_voice("v", PromptVoice(audio, mode="instruct", instruct="Speak slowly."), 2)
    check_voice("v", PromptVoice(audio, mode="instruct", instruct=CANTONESE), 3)
    assert V3_SYSTEM_PROMPT == "You are a helpful assistant.<|endofprompt|>"


@pytest.mark.parametrize(
    ("prompt", "version", "said"),
    [
        ({"mode": "instruct", "instruct": "Speak slowly."}, 1, "mode instruct with a recording needs a CosyVoice2"),
        ({"mode": "instruct", "speaker": "中文男", "audio": ""}, 1, "v.instruct: mode instruct needs the instruction"),
        (
            {"mode": "instruct", "speaker": "中文男", "audio": "", "instruct": "Calm."},
            2,
            "a built-in speaker told an instruction is CosyVoice-300M-Instruct's",
        ),
        ({"mode": "instruct"}, 2, "v.instruct: mode instruct needs the instruction"),
        (
            {"mode": "instruct", "instruct": "请用广东话表达。"},
            3,
            "v.instruct: the instruction must contain <|endofprompt|>",
        ),
        (
            {"mode": "cross_lingual", "instruct": "No marker."},
            3,
            "v.instruct: the instruction must contain <|endofprompt|>",
        ),
        ({"mode": "zero_shot"}, 2, "v.audio: the transcript is empty"),
        ({"mode": "cross_lingual", "audio": "missing.wav"}, 2, "v.audio: file not found: missing.wav"),
    ],
)
def test_a_voice_missing_what_its_mode_needs_is_refused_by_name(tmp_path, prompt, version, said):
    voice = PromptVoice(**{"audio": a_recording(tmp_path / "a.wav"), **prompt})
    with pytest.raises(ConfigError) as refused:
        check_voice("v", voice, version)
    assert said in str(refused.value)


def test_a_told_speaker_needs_mode_instruct_and_no_recording():
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["tts.cosyvoice.prompts.theo={speaker: 中文男, mode: zero_shot}"])
    assert "speaker (a built-in speaker told `instruct`) goes with mode instruct and no audio" in str(refused.value)
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["tts.cosyvoice.prompts.anna={text: t}"])
    assert "tts.cosyvoice.prompts.anna: audio (the voice's recording) is missing" in str(refused.value)
    told = load_config(None, ["tts.cosyvoice.prompts.theo={speaker: 中文男, mode: instruct, instruct: Calm.}"])
    assert told.tts.cosyvoice.prompts["theo"].speaker == "中文男"


def test_an_unknown_mode_is_refused_when_the_config_loads():
    with pytest.raises(ConfigError) as refused:
        load_config(None, ["tts.cosyvoice.prompts.anna={audio: a.wav, mode: instruct2}"])
    assert "tts.cosyvoice.prompts.anna: mode must be one of ('zero_shot', 'cross_lingual', 'instruct')" in str(
        refused.value
    )


def test_the_shipped_mode_configs_change_only_the_voices_of_cosyvoice3():
    base = load_config(REPO / "configs" / "cosyvoice3.yaml")
    cross = load_config(REPO / "configs" / "cosyvoice3-cross-lingual.yaml")
    instruct = load_config(REPO / "configs" / "cosyvoice3-instruct.yaml")
    assert {prompt.mode for prompt in cross.tts.cosyvoice.prompts.values()} == {"cross_lingual"}
    assert cross.speakers == base.speakers and cross.workers == base.workers
    voices = [instruct.tts.cosyvoice.prompts[voice] for voice in instruct.speakers.voices]
    assert [voice.mode for voice in voices] == ["instruct", "instruct"]
    assert all(voice.instruct.endswith("<|endofprompt|>") for voice in voices)
    assert instruct.tts.cosyvoice.batch_size == base.tts.cosyvoice.batch_size
    assert instruct.tts.cosyvoice.precision == base.tts.cosyvoice.precision


@pytest.mark.e2e
@pytest.mark.cosyvoice
@pytest.mark.parametrize("config", ["cosyvoice3-cross-lingual", "cosyvoice3-instruct"])
def test_run_all_speaks_a_mixed_conversation_with_the_shipped_mode_config(tmp_path, models, recording, config):
    """Chinese and English turns, with upstream's voices of the mode config (recordings swapped for the test's)."""
    env = version_env(3)
    shipped = load_config(REPO / "configs" / f"{config}.yaml")
    voices = [f'tts.cosyvoice.prompts.{name}.audio="{recording}"' for name in shipped.speakers.voices]
    settings = [f"tts.cosyvoice.model_dir={models(3)}", "tts.cosyvoice.batch_size=2", *voices]
    settings.append("tts.cosyvoice.precision={llm: fp32, flow: fp32, vocoder: fp32}")  # a CPU's
    turns = ["今天天气很好，我们去公园散步吧。", "A brown dog runs across a green field.", "球是什么颜色的？"]
    source = write_input(
        tmp_path / "in.json",
        [
            {
                "id": "mixed",
                "conversations": [
                    {"from": "human" if i % 2 == 0 else "gpt", "value": text} for i, text in enumerate(turns)
                ],
            }
        ],
    )
    out, log = tmp_path / "out", tmp_path / "log"
    args = [arg for item in settings for arg in ("--set", item)]
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        log,
        "--config",
        REPO / "configs" / f"{config}.yaml",
        "--gpus",
        "cpu:1",
        "--workers",
        "1",
        *args,
        env=env,
        timeout=900,
    )
    logs = "".join(p.read_text() for p in log.rglob("*.log"))
    assert result.returncode == 0, result.stderr + logs[-5000:]
    rows = assert_complete(out)
    assert sorted(r["language"] for r in rows) == ["en", "zh", "zh"]
    assert {r["speaker"] for r in rows} == set(shipped.speakers.voices)
    assert "1 worker of 2 rows each" in logs


def test_a_pools_voices_may_have_modes_and_need_only_what_theirs_uses(tmp_path):
    from convtts.speak.cosyvoice.prompts import as_prompt
    from convtts.speak.pool import read_pool

    a_recording(tmp_path / "a.wav")
    lines = [
        '{"name": "any", "audio": "a.wav", "mode": "cross_lingual", "language": "zh"}',
        '{"name": "sichuan", "audio": "a.wav", "mode": "instruct", "instruct": "用四川话说这句话<|endofprompt|>"}',
        '{"name": "plain", "audio": "a.wav", "text": "Its transcript."}',
    ]
    (tmp_path / "voices.jsonl").write_text("\n".join(lines))
    voices = {voice.name: as_prompt(voice) for voice in read_pool(tmp_path / "voices.jsonl")}
    assert [(v.mode, v.language) for v in voices.values()] == [
        ("cross_lingual", "zh"),
        ("zero_shot", ""),
        ("instruct", ""),
    ]
    for voice in voices.values():
        check_voice("pool voice", voice, 2, keyed=False)
    (tmp_path / "bad.jsonl").write_text('{"audio": "a.wav", "mode": "instruct2"}')
    with pytest.raises(ConfigError) as refused:
        read_pool(tmp_path / "bad.jsonl")
    assert "bad.jsonl line 1: mode must be one of ('zero_shot', 'cross_lingual', 'instruct')" in str(refused.value)
