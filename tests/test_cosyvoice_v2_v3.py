"""CosyVoice2 and CosyVoice3 through the real runtime: random models of the released layout, zero-shot voices.

v2 runs through the installed package (cosyvoice2-eu) and through a checkout of the official
repository; v3 only through a checkout, since no package bundles it. The checkout is the one
$COSYVOICE_ROOT names (CI points it at ../shared/runtime/CosyVoice when that is there).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from conftest import COSYVOICE_CHECKOUT as CHECKOUT
from conftest import REPO, assert_complete, python_reports, run_all, script_env, write_input
from convtts.counts import plural
from convtts.testing.cosyvoice_qwen import SAMPLE_RATE, expected_samples

pytestmark = pytest.mark.cosyvoice

RATIO = 3  # speech tokens per text token: short audio keeps the test fast
NO_CHECKOUT = (
    "needs a checkout of the official CosyVoice repository (with third_party/Matcha-TTS): "
    "COSYVOICE_ROOT=/path/to/CosyVoice make test"
)
PROMPT_TEXT = "Hello, this is a short prompt for a new voice."
INSTRUCTION = "You are a helpful assistant.<|endofprompt|>"  # CosyVoice3 asks for it in every prompt
# int16 steps a batched row may stand from upstream's rendering of it alone, both in fp32: only the
# order of the sums differs (u = 2**-24 of each result, about sqrt(n) u a layer for sums of n ~ 1e3
# terms; test_cosyvoice_batch.py derives it), within 1e-5 of full scale, a third of one int16 step
# (2**-15 = 3.1e-5). Rounded to int16 apart, two values less than a step apart land at most one
# step apart. Measured on v3 (CPU, AVX-512 MKL): 1.1e-7 beside a real neighbour, 0 or 1 step, the
# same with 1 or 2 threads; under AVX2 kernels 1.3e-7, 1 step. The flow's mel (1e-6) and the
# vocoder's samples (1e-7) the same beside random tokens, 4x the padding or a NaN mel. Whether two
# rows of the run share a pass is up to timing (when each decode ends), hence the probe's own
# batched call. The shipped config's bf16 LLM and flow are another format (a bf16 flow: 2e-3 of
# full scale of fp32, 65 steps): the run is held to fp32, and test_flow_vocoder.py bounds bf16.
SAME_AS_ALONE = 1
CONVERSATION = {
    "id": "dog",
    "conversations": [
        {"from": "human", "value": "Describe the picture in a few words."},
        {"from": "gpt", "value": "A brown dog runs across a green field. A small child follows it with a red ball."},
        {"from": "human", "value": "What colour is the ball?"},
    ],
}


def runtime_env(runtime: str) -> dict:
    env = script_env()
    if runtime == "checkout":
        if not CHECKOUT:
            pytest.skip(NO_CHECKOUT)
        env["COSYVOICE_ROOT"] = CHECKOUT
    return env


def write_model(path, version: int, runtime: str):
    env = runtime_env(runtime)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "convtts.testing.cosyvoice_model",
            "--version",
            str(version),
            "--size",
            "tiny",
            "--out",
            str(path),
            "--tokens-per-text-token",
            str(RATIO),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return path


@pytest.fixture(scope="module")
def v2_model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("cv2") / "CosyVoice2-tiny", 2, "installed")


@pytest.fixture(scope="module")
def v3_model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("cv3") / "CosyVoice3-tiny", 3, "checkout")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """Two prompt recordings spoken by the default Piper voice (22050 Hz, as a user's file would be)."""
    from convtts.config import load_config
    from convtts.speak.piper import PiperBackend

    folder = tmp_path_factory.mktemp("prompts")
    # noise scales 0: the same recordings in every session (test_cosyvoice_batch_qwen.py says why)
    steady = "noise_scale: 0.0, noise_w_scale: 0.0, volume: 1.0"
    sets = [
        "speakers.voices=[joe, joe-slow]",
        f"tts.piper.voices.joe={{length_scale: 1.0, {steady}}}",
        f"tts.piper.voices.joe-slow={{length_scale: 1.15, {steady}}}",
    ]
    piper = PiperBackend(load_config(None, sets))
    for name, speaker in (("anna", "joe"), ("ben", "joe-slow")):
        sf.write(folder / f"{name}.wav", piper.synthesize(PROMPT_TEXT, speaker, 0), piper.sample_rate)
    piper.close()
    return folder


def overrides(model, prompts, version: int) -> list[str]:
    text = (INSTRUCTION if version == 3 else "") + PROMPT_TEXT
    return [
        f"tts.cosyvoice.model_dir={model}",
        "text.max_words=12",
        "workers.rebuild_every=2",
        *(
            f'tts.cosyvoice.prompts.{name}={{audio: "{prompts / (name + ".wav")}", text: "{text}"}}'
            for name in ("anna", "ben")
        ),
    ]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(
    "version, runtime, batch",
    [(2, "installed", 1), (2, "checkout", 1), (3, "checkout", 1), (3, "checkout", 2)],
    ids=["v2-installed", "v2-checkout", "v3-checkout", "v3-checkout-batched"],
)
def test_run_all_speaks_zero_shot_voices(request, tmp_path, prompts, version, runtime, batch):
    env = runtime_env(runtime)
    model = request.getfixturevalue(f"v{version}_model")
    config = REPO / "configs" / f"cosyvoice{version}.yaml"
    # batched, the engine takes its rows and one request ahead before any is done: a rebuild every
    # utterance, so that one is due while the four are spoken
    every = 2 if batch == 1 else 1
    settings = overrides(model, prompts, version) + [
        f"tts.cosyvoice.batch_size={batch}",
        f"workers.rebuild_every={every}",
    ]
    # batched in fp32: the probe's take is then upstream's own path (an LLM cast to bf16 sends it through
    # the engine too), and what sets them apart float rounding, not bf16's (SAME_AS_ALONE)
    if batch > 1:
        settings.append("tts.cosyvoice.precision={llm: fp32, flow: fp32, vocoder: fp32}")
    source = write_input(tmp_path / "in.json", [CONVERSATION])
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
        config,
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
    assert len(rows) == 4 and {r["sample_rate"] for r in rows} == {SAMPLE_RATE}
    assert {r["speaker"] for r in rows} == {"anna", "ben"}  # one prompted voice per side

    # the runtime asked for is the one the workers loaded
    where = (
        str(Path(CHECKOUT).resolve()) if runtime == "checkout" else "site-packages"
    )  # the runtime logs resolved paths
    loads = [line for line in logs.splitlines() if f"loaded CosyVoice{version} " in line]
    assert len(loads) >= 2 and all(where in line for line in loads), loads

    # the batched engine spoke them, or upstream's own path did
    assert (f"1 worker of {batch} rows each" in logs) == (batch > 1)
    assert "ignored: batching" not in logs  # the worker's warning when a model cannot be batched

    # rebuilds land mid-shard (4 utterances, one shard); a batch's feed stops once one is due, and
    # what is in flight (the rows and what the engine takes ahead of them, never twice the rows)
    # finishes first
    assert sum(f"(every {plural(every, 'utterance')})" in line for line in logs.splitlines()) >= 1
    since = sorted(r["since_build"] for r in rows)
    assert since[0] == 0 and max(since) <= every - 1 + 2 * batch, since
    assert batch > 1 or since == [0, 0, 1, 1]

    # Spoken again in a fresh process by upstream's own path (inference_zero_shot), by a model
    # never rebuilt: same seed, same audio (batched: the same tokens, and the flow within float
    # rounding of the solo rendering); lengths as pinned (RATIO speech tokens per text token, 960
    # samples per speech token).
    probe = tmp_path / "probe"
    probe.mkdir()
    (tmp_path / "settings.json").write_text(json.dumps({"config": str(config), "overrides": settings}))
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "cosyvoice_probe.py"),
            str(tmp_path / "settings.json"),
            str(tmp_path / "rows.json"),
            str(probe),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((probe / "report.json").read_text())
    assert where in report["runtime"]
    assert report["endofprompt_id"] == 151646  # the id CosyVoice3 checks for, as in the released tokenizer
    for row in rows:
        tokens = report["rows"][row["id"]]
        assert row["num_samples"] == sum(expected_samples(int(t * RATIO)) for t in tokens), (row["id"], tokens)
        written, _ = sf.read(out / row["audio"], dtype="int16")
        alone = as_written(np.load(probe / f"{row['id']}.npy"))
        if batch == 1:
            assert np.array_equal(written, alone), row["id"]
        else:  # the run's passes, then the probe's, whose first two rows share theirs
            together = as_written(np.load(probe / f"{row['id']}.together.npy"))
            for take in (written, together):
                assert take.shape == alone.shape and np.abs(take.astype(int) - alone).max() <= SAME_AS_ALONE, row["id"]
    assert batch == 1 or report["shared_vocoder_passes"] >= 1


def test_v2_directory_has_the_released_layout(v2_model):
    names = {p.name for p in v2_model.iterdir()}
    assert {
        "cosyvoice2.yaml",
        "llm.pt",
        "flow.pt",
        "hift.pt",
        "campplus.onnx",
        "speech_tokenizer_v2.onnx",
        "CosyVoice-BlankEN",
        "convtts_model.json",
    } <= names
    blank = {p.name for p in (v2_model / "CosyVoice-BlankEN").iterdir()}
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json"} <= blank
    config = json.loads((v2_model / "CosyVoice-BlankEN" / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["vocab_size"] == 151936
    assert (config.get("dtype") or config.get("torch_dtype")) == "bfloat16"  # as released
    info = json.loads((v2_model / "convtts_model.json").read_text())
    assert info["model_version"] == 2 and info["tokens_per_text_token"] == RATIO


def as_written(samples) -> np.ndarray:
    """The int16 samples a WAV written by the pipeline holds for these float samples."""
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(samples, -1.0, 1.0), SAMPLE_RATE, subtype="PCM_16", format="WAV")
    buffer.seek(0)
    return sf.read(buffer, dtype="int16")[0]


V1_THEN_V2 = """
import json, sys
from convtts.config import CosyVoiceConfig
from convtts.speak.cosyvoice.runtime import load_model
load_model(CosyVoiceConfig(model_dir=sys.argv[1]))
seen = {"after_v1": "transformers" in sys.modules}
v2 = load_model(CosyVoiceConfig(model_dir=sys.argv[2]))
import transformers
seen["v2_backbone"] = isinstance(v2.model.llm.llm.model, transformers.Qwen2ForCausalLM)
print(json.dumps(seen))
"""


def test_a_v2_model_loads_after_a_v1_model_left_transformers_unimported(tmp_path, v2_model):
    # the v1 load leaves placeholders for transformers' classes in cosyvoice's modules; v2 subclasses one
    from convtts.testing.cosyvoice_model import build_model_dir

    v1_model = build_model_dir(tmp_path / "cv1", "tiny", ("英文女",), tokens_per_text_token=RATIO)
    seen = python_reports(V1_THEN_V2, v1_model, v2_model, env=runtime_env("installed"), timeout=600)
    assert seen == {"after_v1": False, "v2_backbone": True}
