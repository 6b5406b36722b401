"""convtts check-model on a tiny random v1 model (CPU): the shipped engine passes, a fault in it fails its part."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import COSYVOICE_CHECKOUT as CHECKOUT
from conftest import REPO, need, script_env

need("cosyvoice", "cosyvoice")

from convtts.speak.cosyvoice import check  # noqa: E402
from convtts.speak.cosyvoice.engine import audio  # noqa: E402
from convtts.speak.cosyvoice.engine.engine import BatchEngine  # noqa: E402
from convtts.speak.cosyvoice.engine.flow import Flow  # noqa: E402
from convtts.speak.cosyvoice.engine.requests import place  # noqa: E402
from convtts.speak.cosyvoice.engine.sampler import Sampler  # noqa: E402
from convtts.speak.cosyvoice.engine.vocoder import Vocoder  # noqa: E402
from convtts.testing.cosyvoice_model import build_model_dir  # noqa: E402

pytestmark = pytest.mark.cosyvoice

VOICES = ("英文女", "英文男")
CONFIG = str(REPO / "configs" / "cosyvoice.yaml")  # bf16 LLM and flow, tf32 vocoder, as shipped
CPU_FP32 = 1e-6  # fp32 audio against upstream's on a CPU, of full scale: measured 1.2e-7 (a GPU: check.FP32_PASS)
NO_CHECKOUT = "needs a checkout of the official CosyVoice repository: COSYVOICE_ROOT=/path/to/CosyVoice make test"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("check") / "tiny", "tiny", VOICES, tokens_per_text_token=4)


def arguments(model_dir, out, texts=2) -> list[str]:
    return [
        "--config",
        CONFIG,
        "--set",
        f"tts.cosyvoice.model_dir={model_dir}",
        "--texts",
        str(texts),
        "--out",
        str(out),
    ]


def verdicts(out) -> dict:
    runs = json.loads(out.read_text())["runs"]
    return {(run, part): figures["verdict"] for run, parts in runs.items() for part, figures in parts.items()}


def test_the_shipped_engine_passes_against_upstream(model_dir, tmp_path):
    """The command as a user runs it, with a Chinese text among the English ones."""
    out = tmp_path / "check.json"
    command = [sys.executable, "-m", "convtts", "check-model", *arguments(model_dir, out, texts=3)]
    done = subprocess.run(command, env=script_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    fp32 = report["runs"]["fp32"]
    assert fp32["llm"]["agree"] == fp32["llm"]["steps"] > 0 and fp32["llm"]["max_tv"] <= check.FP32_TV_PASS, fp32
    assert fp32["audio"]["compared"] == 3 and fp32["audio"]["max_abs"] <= CPU_FP32, fp32
    shipped = report["runs"]["config (llm bf16, flow bf16, vocoder tf32)"]
    assert 0 < shipped["llm"]["max_tv"] <= check.REDUCED_TV_PASS, shipped  # bf16: near, not equal
    assert shipped["llm"]["steps"] == fp32["llm"]["steps"]  # the same tokens, upstream's
    assert shipped["audio"]["compared"] == 3 and 0 < shipped["audio"]["max_abs"] <= check.REDUCED_PASS, shipped
    assert report["failed"] == [] and check.FAIL not in verdicts(out).values()
    for run in report["runs"]:
        assert run in done.stdout  # the table names every run
    assert "pass" in done.stdout and str(out) in done.stdout


def test_a_louder_vocoder_fails_the_audio(model_dir, tmp_path, monkeypatch, capsys):
    speak = Vocoder.speak

    def louder(self, streams, mels, speed):
        return [a if isinstance(a, BaseException) else a * 1.05 for a in speak(self, streams, mels, speed)]

    monkeypatch.setattr(Vocoder, "speak", louder)
    out = tmp_path / "check.json"
    assert check.main(arguments(model_dir, out)) == 1
    found = verdicts(out)
    assert found[("fp32", "audio")] == check.FAIL and found[("fp32", "llm")] == "pass", found
    assert "failed: audio (fp32)" in capsys.readouterr().err


def test_a_vocoder_past_its_threshold_in_bf16_fails_there_and_the_formats_say_so(model_dir, tmp_path, monkeypatch):
    """A fault only in the bf16 vocoder: the config that runs it fails its audio, fp32 passes, and
    --formats lists bf16 as the vocoder's failing format, the others passing."""
    speak = Vocoder.speak

    def offset_in_bf16(self, streams, mels, speed):  # a tenth of full scale added: past bf16's 5e-2
        spoken = speak(self, streams, mels, speed)
        return [a + 0.1 if self.precision == "bf16" and not isinstance(a, BaseException) else a for a in spoken]

    monkeypatch.setattr(Vocoder, "speak", offset_in_bf16)
    out = tmp_path / "check.json"
    argv = [*arguments(model_dir, out), "--set", "tts.cosyvoice.precision.vocoder=bf16", "--formats"]
    assert check.main(argv) == 1
    report = json.loads(out.read_text())
    assert report["failed"] == ["audio (config (llm bf16, flow bf16, vocoder bf16))"], report["failed"]
    settings = report["settings"]
    assert settings["vocoder"] == {"pass": ["fp32", "tf32", "fp16"], "warn": [], "fail": ["bf16"], "refused": []}
    assert settings["flow"]["pass"] == settings["llm"]["pass"] == ["fp32", "tf32", "bf16", "fp16"], settings
    assert len(report["formats"]) == 9


def test_a_flow_whose_mels_are_off_fails_the_audio_not_the_llm(model_dir, tmp_path, monkeypatch, capsys):
    mels = Flow.mels
    # half a unit of log mel: every band 1.65 times louder
    monkeypatch.setattr(Flow, "mels", lambda self, seqs: [mel + 0.5 for mel in mels(self, seqs)])
    out = tmp_path / "check.json"
    assert check.main(arguments(model_dir, out)) == 1
    found = verdicts(out)
    assert found[("fp32", "audio")] == check.FAIL and found[("fp32", "llm")] == "pass", found
    assert "failed: audio (fp32)" in capsys.readouterr().err


def test_a_shifted_token_fails_the_llm(model_dir, tmp_path, monkeypatch, capsys):
    draw = Sampler.draw

    def shifted(self, scores, rows):
        ends = scores.shape[-1] - 1  # v1's last logit is the end of speech: left alone, lengths stay
        return [t if isinstance(t, BaseException) or t + 1 >= ends else t + 1 for t in draw(self, scores, rows)]

    monkeypatch.setattr(Sampler, "draw", shifted)
    out = tmp_path / "check.json"
    assert check.main(arguments(model_dir, out)) == 1
    report = json.loads(out.read_text())
    assert report["failed"] == ["llm (fp32)"], report["failed"]  # the bf16 run's draws are shown, not judged
    llm = report["runs"]["fp32"]["llm"]
    assert llm["agree"] < llm["steps"] / 2 and llm["max_tv"] <= check.FP32_TV_PASS, llm  # its logits are right
    assert "failed: llm (fp32)" in capsys.readouterr().err


def test_a_sharper_distribution_fails_the_llm_and_leaves_the_audio(model_dir, tmp_path, monkeypatch):
    step = BatchEngine._step
    monkeypatch.setattr(BatchEngine, "_step", lambda self: step(self) * 1.2)  # the logits of a colder model
    out = tmp_path / "check.json"
    assert check.main(arguments(model_dir, out)) == 1
    report = json.loads(out.read_text())
    assert "llm (fp32)" in report["failed"] and report["runs"]["fp32"]["llm"]["max_tv"] > check.FP32_TV_WARN
    assert verdicts(out)[("fp32", "audio")] == "pass"  # upstream's tokens went on to the flow


def test_a_dropped_chunk_fails_the_audio(model_dir, tmp_path, monkeypatch, capsys):
    """The fifteenth text is the first that this model's frontend splits in two."""
    monkeypatch.setattr(audio, "place", lambda parts, index, value: index == 1 or place(parts, index, value))
    out = tmp_path / "check.json"
    assert check.main(arguments(model_dir, out, texts=15)) == 1
    report = json.loads(out.read_text())
    assert report["failed"] == ["audio (config (llm bf16, flow bf16, vocoder tf32))", "audio (fp32)"], report
    assert report["runs"]["fp32"]["audio"]["max_duration_ms"] > 100
    assert verdicts(out)[("fp32", "llm")] == "pass"


def test_a_bad_config_exits_2(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        check.main(["--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "x.json")])
    assert exit_.value.code == 2
    with pytest.raises(SystemExit) as exit_:
        check.main(["--config", CONFIG, "--set", f"tts.cosyvoice.model_dir={tmp_path}/none", "--texts", "1"])
    assert exit_.value.code == 2


def zero_shot(tmp_path, version: int, model) -> list[str]:
    """The arguments for a tiny v2 or v3 model of two zero-shot voices on a 2 s noise prompt."""
    import numpy as np
    import soundfile as sf

    wav = tmp_path / "prompt.wav"
    sf.write(wav, (np.random.default_rng(0).standard_normal(2 * 24000) * 0.05).astype("float32"), 24000)
    text = ("You are a helpful assistant.<|endofprompt|>" if version == 3 else "") + "Hello, a short prompt."
    argv = ["--config", f"cosyvoice{version}", "--set", f"tts.cosyvoice.model_dir={model}", "--texts", "2"]
    for name in ("anna", "ben"):
        argv += ["--set", f'tts.cosyvoice.prompts.{name}={{audio: "{wav}", text: "{text}"}}']
    return [*argv, "--out", str(tmp_path / "check.json")]


def assert_fp32_is_upstream(out):
    fp32 = json.loads(out.read_text())["runs"]["fp32"]
    assert fp32["llm"]["agree"] == fp32["llm"]["steps"] > 0 and fp32["llm"]["max_tv"] <= check.FP32_TV_PASS, fp32
    assert fp32["audio"]["compared"] == 2, fp32
    assert fp32["audio"]["max_abs"] <= CPU_FP32, fp32


def test_a_v2_model_with_zero_shot_voices_passes(tmp_path):
    """CosyVoice2 (the installed runtime): the Qwen2 engine against upstream's zero-shot path."""
    model = build_model_dir(tmp_path / "model", "tiny", (), tokens_per_text_token=3, version=2)
    assert check.main(zero_shot(tmp_path, 2, model)) == 0
    assert_fp32_is_upstream(tmp_path / "check.json")


def test_a_v3_model_passes_through_a_checkout(tmp_path):
    """CosyVoice3 needs a checkout of the official repository, hence a process of its own."""
    if not CHECKOUT:
        pytest.skip(NO_CHECKOUT)
    env, model = script_env(COSYVOICE_ROOT=CHECKOUT), tmp_path / "model"
    build = [
        "-m",
        "convtts.testing.cosyvoice_model",
        "--version",
        "3",
        "--out",
        str(model),
        "--tokens-per-text-token",
        "3",
    ]
    subprocess.run([sys.executable, *build], env=env, check=True, capture_output=True, timeout=300)
    command = [sys.executable, "-m", "convtts", "check-model", *zero_shot(tmp_path, 3, model), "--formats"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_fp32_is_upstream(tmp_path / "check.json")
    report = json.loads((tmp_path / "check.json").read_text())
    assert report["settings"]["flow"]["refused"] == ["fp16"]  # the format known to overflow on released weights
    assert "overflows to NaN" in report["formats"]["flow fp16 (the rest fp32)"]["refused"]["reason"]
    assert "flow fp16 (the rest fp32)" in done.stdout and "formats by part" in done.stdout
