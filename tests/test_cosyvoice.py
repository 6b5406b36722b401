"""The CosyVoice backend on a tiny random-weight v1 model, with the real upstream runtime (CPU)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import soundfile

from conftest import python_reports
from convtts.config import Config, ConfigError, CosyVoiceConfig, PromptVoice, SpeakerConfig, TTSConfig, load_config
from convtts.speak.base import OutOfMemory, SynthesisError
from convtts.speak.cosyvoice.backend import CosyVoiceBackend
from convtts.speak.cosyvoice.runtime import check_model_dir, constructor_kwargs
from convtts.speak.cosyvoice.voice_check import check
from convtts.testing.cosyvoice_model import build_model_dir, model_info
from convtts.testing.cosyvoice_v1 import expected_samples, text_token_counts

pytestmark = pytest.mark.cosyvoice

ROOT = Path(__file__).resolve().parents[1]
RATIO = 4  # speech tokens per text token in the tiny model: short audio, fast tests
SPEAKERS = ("英文女", "英文男", "中文女")
TEXT = "The weather was lovely this morning. We walked to the harbour and watched the boats come in."


def make_config(model_dir, voices=("英文女", "英文男"), **cosy) -> Config:
    return Config(
        speakers=SpeakerConfig(voices=tuple(voices), policy="single"),
        tts=TTSConfig(backend="cosyvoice", cosyvoice=CosyVoiceConfig(model_dir=str(model_dir), **cosy)),
    )


@pytest.fixture(scope="module")
def network_attempts():
    """Every outgoing connection in this module fails and is recorded: all of it must run offline."""
    attempts = []

    def refuse(sock, address, *args):
        attempts.append(address)
        raise OSError(f"network disabled in tests: {address}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", refuse)
        patch.setattr(socket.socket, "connect_ex", refuse)
        yield attempts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, network_attempts):
    return build_model_dir(tmp_path_factory.mktemp("cv") / "tiny", "tiny", SPEAKERS, tokens_per_text_token=RATIO)


@pytest.fixture(scope="module")
def backend(model_dir):
    loaded = CosyVoiceBackend(make_config(model_dir))
    yield loaded
    loaded.close()


def test_generated_directory_is_a_v1_sft_model(model_dir):
    import onnxruntime
    import torch

    for name in (
        "cosyvoice.yaml",
        "llm.pt",
        "flow.pt",
        "hift.pt",
        "spk2info.pt",
        "campplus.onnx",
        "speech_tokenizer_v1.onnx",
    ):
        assert (model_dir / name).is_file(), name
    spk2info = torch.load(model_dir / "spk2info.pt", weights_only=True)
    assert list(spk2info) == list(SPEAKERS)
    assert spk2info["英文女"]["embedding"].shape == (1, 192)
    assert "http" not in (model_dir / "cosyvoice.yaml").read_text()
    info = model_info(model_dir)
    assert info["tokens_per_text_token"] == RATIO and info["size"] == "tiny"

    campplus = onnxruntime.InferenceSession(str(model_dir / "campplus.onnx"))
    out = campplus.run(None, {"input": np.zeros((1, 37, 80), np.float32)})[0]
    assert [i.name for i in campplus.get_inputs()] == ["input"] and out.shape == (1, 192)
    tokenizer = onnxruntime.InferenceSession(str(model_dir / "speech_tokenizer_v1.onnx"))
    feats = np.random.default_rng(0).standard_normal((1, 128, 101)).astype(np.float32)
    codes = tokenizer.run(None, {"feats": feats, "feats_length": np.array([101], np.int32)})[0]
    assert codes.shape == (1, 51) and codes.dtype == np.int32 and codes.max() < 4096


def test_audio_length_is_the_pinned_decode_length(backend):
    counts = text_token_counts(backend.model.frontend, TEXT)
    assert len(counts) == 2  # one chunk per sentence, decoded apart and concatenated
    audio = backend.synthesize(TEXT, "英文女", seed=3)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert len(audio) == expected_samples(counts, RATIO)
    assert backend.sample_rate == 22050
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0


def test_same_seed_same_audio_after_rebuild(model_dir, backend):
    first = backend.synthesize(TEXT, "英文男", seed=11)
    other = backend.synthesize(TEXT, "英文男", seed=12)
    assert not np.array_equal(first, other)
    rebuilt = CosyVoiceBackend(make_config(model_dir))  # the load resets global seeds to 1986
    try:
        rebuilt.synthesize("Something else first.", "英文女", seed=5)
        again = rebuilt.synthesize(TEXT, "英文男", seed=11)
    finally:
        rebuilt.close()
    assert np.array_equal(first, again)


def test_close_drops_the_model(model_dir):
    loaded = CosyVoiceBackend(make_config(model_dir))
    ref = weakref.ref(loaded.model)
    loaded.close()
    assert ref() is None
    with pytest.raises(SynthesisError):
        loaded.synthesize(TEXT, "英文女", seed=1)
    assert loaded.gpu_memory_mb("reserved") == 0.0 and loaded.gpu_memory_mb("allocated") == 0.0
    with pytest.raises(ValueError):
        loaded.gpu_memory_mb("peak")


def test_close_on_a_gpu_frees_the_cublas_workspaces_before_emptying_the_cache(model_dir, monkeypatch):
    import torch

    loaded = CosyVoiceBackend(make_config(model_dir))
    loaded.uses_cuda = True  # as in a worker on a GPU; only the release calls below differ
    calls = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("workspaces"), raising=False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("cache"))
    loaded.close()
    assert calls == ["workspaces", "cache"]


def test_unknown_speakers_are_refused_with_the_valid_names(model_dir, backend):
    config = make_config(model_dir, voices=("英文女", "Joanna"))
    with pytest.raises(ConfigError, match="Joanna") as excinfo:
        check(config)
    assert all(name in str(excinfo.value) for name in SPEAKERS)
    with pytest.raises(ConfigError, match="Joanna"):
        CosyVoiceBackend(config)
    with pytest.raises(SynthesisError, match="英文男"):
        backend.synthesize(TEXT, "Joanna", seed=1)
    check(make_config(model_dir, voices=SPEAKERS))


def test_missing_model_dir_fails_before_any_download(tmp_path, network_attempts, monkeypatch):
    import cosyvoice.cli.cosyvoice as upstream

    def no_download(*args, **kwargs):
        raise AssertionError("upstream tried to download the model")

    monkeypatch.setattr(upstream, "snapshot_download", no_download)
    for missing in (tmp_path / "nowhere", "iic/CosyVoice-300M-SFT"):
        config = make_config(missing)
        with pytest.raises(ConfigError, match="model directory not found"):
            check(config)
        with pytest.raises(ConfigError, match="model directory not found"):
            CosyVoiceBackend(config)
    assert network_attempts == []


def test_upstream_downloader_is_disabled(backend, network_attempts):
    upstream = sys.modules["cosyvoice.cli.cosyvoice"]
    with pytest.raises(ConfigError, match="tried to download"):
        upstream.CosyVoice("iic/CosyVoice-300M-SFT")  # upstream's own constructor, no check first
    assert network_attempts == []


def test_incomplete_model_dir_names_what_is_missing(tmp_path, model_dir):
    (tmp_path / "cosyvoice.yaml").write_text("sample_rate: 22050\n")
    with pytest.raises(ConfigError, match="llm.pt"):
        check(make_config(tmp_path))
    with pytest.raises(ConfigError, match="holds none of"):
        check(make_config(tmp_path / ".."))
    with pytest.raises(ConfigError, match=r"llm\.text_encoder\.fp16\.zip"):
        check_model_dir(CosyVoiceConfig(model_dir=str(model_dir), load_jit=True, fp16=True))


def test_wrong_runtime_root_is_explained(tmp_path, model_dir, monkeypatch):
    config = make_config(model_dir, runtime_root=str(tmp_path))
    with pytest.raises(ConfigError, match="not a CosyVoice checkout"):
        check(config)
    with pytest.raises(ConfigError, match="not a CosyVoice checkout"):
        CosyVoiceBackend(config)
    (tmp_path / "cosyvoice" / "cli").mkdir(parents=True)
    (tmp_path / "cosyvoice" / "cli" / "cosyvoice.py").write_text("")
    with pytest.raises(ConfigError, match="Matcha-TTS"):
        check(config)
    monkeypatch.setenv("COSYVOICE_ROOT", str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match=r"\$COSYVOICE_ROOT"):
        check(make_config(model_dir))


def test_load_options_follow_the_constructor_signature():
    from cosyvoice.cli.cosyvoice import CosyVoice

    kwargs = constructor_kwargs(CosyVoice, CosyVoiceConfig(fp16=True, load_vllm=True))
    assert kwargs == {"fp16": True, "load_jit": False, "load_trt": False}


def test_zero_shot_voice_from_a_prompt_file(tmp_path, model_dir, backend):
    prompt = tmp_path / "anna.wav"
    soundfile.write(prompt, backend.synthesize("Good morning to you all.", "中文女", seed=2), 22050)
    config = make_config(
        model_dir,
        voices=("英文女", "anna"),
        prompts={"anna": PromptVoice(audio=str(prompt), text="Good morning to you all.")},
    )
    check(config)
    loaded = CosyVoiceBackend(config)
    try:
        counts = text_token_counts(loaded.model.frontend, TEXT)
        first = loaded.synthesize(TEXT, "anna", seed=9)
        assert len(first) == expected_samples(counts, RATIO)  # the prompt's own tokens are not spoken
        assert np.array_equal(first, loaded.synthesize(TEXT, "anna", seed=9))
    finally:
        loaded.close()


def test_out_of_memory_in_the_decoding_thread_is_not_swallowed(backend, monkeypatch):
    import torch

    expected = backend.synthesize(TEXT, "英文女", seed=21)
    llm = backend.model.model.llm

    def failing(error):
        def inference(**kwargs):
            yield 17  # a token decoded, then the failure: upstream would return this token's audio
            raise error

        return inference

    monkeypatch.setattr(
        llm, "inference", failing(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    )
    with pytest.raises(OutOfMemory, match=r"^CUDA out of memory\. Tried to allocate 2\.00 GiB$"):  # said once
        backend.synthesize(TEXT, "英文女", seed=21)
    monkeypatch.setattr(llm, "inference", failing(RuntimeError("sampling reaches max_trials 100")))
    with pytest.raises(SynthesisError, match="max_trials") as excinfo:
        backend.synthesize(TEXT, "英文女", seed=21)
    assert not isinstance(excinfo.value, OutOfMemory)
    monkeypatch.undo()
    assert np.array_equal(backend.synthesize(TEXT, "英文女", seed=21), expected)
    assert backend.model.model.tts_speech_token_dict == {}


@pytest.mark.parametrize("version", [2, 3])
def test_v2_and_v3_voices_must_be_prompts(tmp_path, version):
    model = tmp_path / "model"
    (model / "CosyVoice-BlankEN").mkdir(parents=True)
    for name in (
        f"cosyvoice{version}.yaml",
        "llm.pt",
        "flow.pt",
        "hift.pt",
        "campplus.onnx",
        f"speech_tokenizer_v{version}.onnx",
    ):
        (model / name).write_bytes(b"")
    audio = tmp_path / "anna.wav"
    soundfile.write(audio, np.zeros(16000, np.float32), 16000)
    text = "You are a helpful assistant.<|endofprompt|>Hello there." if version == 3 else "Hello there."
    with pytest.raises(ConfigError, match="need prompts"):
        check(make_config(model, voices=("anna",)))
    with pytest.raises(ConfigError, match="file not found"):
        check(
            make_config(
                model, voices=("anna",), prompts={"anna": PromptVoice(audio=str(tmp_path / "x.wav"), text=text)}
            )
        )
    if version == 3:
        with pytest.raises(ConfigError, match="endofprompt"):
            check(make_config(model, voices=("anna",), prompts={"anna": PromptVoice(audio=str(audio), text="Hello.")}))
    check(make_config(model, voices=("anna",), prompts={"anna": PromptVoice(audio=str(audio), text=text)}))


def test_cli_eos_bias_high_stops_at_the_minimum(tmp_path):
    out = tmp_path / "high"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "convtts.testing.cosyvoice_model",
            "--out",
            str(out),
            "--size",
            "tiny",
            "--eos-bias",
            "high",
            "--speakers",
            "英文女,narrator",
            "--seed",
            "7",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["tokens_per_text_token"] == 2.0 and info["speakers"] == ["英文女", "narrator"]
    loaded = CosyVoiceBackend(make_config(out, voices=("narrator",)))
    try:
        counts = text_token_counts(loaded.model.frontend, TEXT)
        assert len(loaded.synthesize(TEXT, "narrator", seed=1)) == expected_samples(counts, 2)
    finally:
        loaded.close()


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    config = load_config(path)  # raises ConfigError on a typo, a wrong type or a bad value
    assert config.tts.backend in ("piper", "cosyvoice")


def test_example_gpu_config_says_what_a_gpu_node_needs():
    config = load_config(ROOT / "configs" / "cosyvoice.yaml")
    assert config.tts.backend == "cosyvoice"
    assert config.tts.cosyvoice.model_dir.endswith("CosyVoice-300M-SFT")
    assert config.speakers.voices == ("英文女", "英文男")
    # the measured best (docs/PERFORMANCE.md): 96 rows in bf16, 768 a GPU, a rebuild every 2000 with a memory limit too
    assert config.tts.cosyvoice.batch_size == 96 and config.tts.cosyvoice.precision.llm == "bf16"
    assert config.workers.rows_per_gpu == 768
    assert config.workers.rebuild_every == 2000 and config.workers.max_gpu_mb > 0


WETEXT_CHILD = """
import sys
sys.modules["tn"] = None  # as on a machine without WeTextProcessing (and its 165 MB pynini)
import numpy as np
from convtts.speak.cosyvoice.backend import CosyVoiceBackend
from convtts.config import Config, CosyVoiceConfig, SpeakerConfig, TTSConfig
config = Config(speakers=SpeakerConfig(voices=("英文女",)),
                tts=TTSConfig(backend="cosyvoice", cosyvoice=CosyVoiceConfig(model_dir=sys.argv[1])))
backend = CosyVoiceBackend(config)
assert "wetext" in (sys.modules["tn"].__doc__ or ""), sys.modules["tn"]
backend.close()
backend = CosyVoiceBackend(config)  # a rebuild in the same process finds the stand-in in place
print(backend.model.frontend.text_normalize(sys.argv[3], split=False))
np.save(sys.argv[2], backend.synthesize(sys.argv[3], "英文女", seed=4))
"""


def test_text_normalisation_served_by_wetext_when_tn_is_missing(tmp_path, model_dir, backend):
    text = "On 3/4/2021, 42 people came. It cost $12.50."
    done = subprocess.run(
        [sys.executable, "-c", WETEXT_CHILD, str(model_dir), str(tmp_path / "audio.npy"), text],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "forty two people" in done.stdout and "twelve point five dollars" in done.stdout
    # Same normalised text as WeTextProcessing, so the same tokens and the same audio.
    assert np.array_equal(np.load(tmp_path / "audio.npy"), backend.synthesize(text, "英文女", seed=4))


def test_the_speaker_check_reads_the_table_without_torch_and_refuses_what_is_not_one(tmp_path, model_dir):
    """The up-front check names the model's SFT speakers without importing torch (a fresh process
    shows it), falls back to torch for the old pickle format, and names a file that is no table."""
    import torch

    from convtts.speak.cosyvoice.voice_check import builtin_speakers, table_keys

    probe = (
        "import sys; from convtts.speak.cosyvoice.voice_check import builtin_speakers; "
        f"print(builtin_speakers({str(model_dir)!r}), 'torch' in sys.modules)"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert shown.stdout.strip() == f"{list(SPEAKERS)} False"
    old = tmp_path / "old"
    old.mkdir()
    torch.save(
        {"a": {"embedding": torch.zeros(1, 192)}, "b": {}}, old / "spk2info.pt", _use_new_zipfile_serialization=False
    )
    assert table_keys(old / "spk2info.pt") is None and builtin_speakers(str(old)) == ["a", "b"]
    torch.save([1, 2], old / "spk2info.pt")
    with pytest.raises(ConfigError, match="does not hold a speaker table"):
        builtin_speakers(str(old))
    (old / "spk2info.pt").write_bytes(b"not a table")
    with pytest.raises(ConfigError, match="cannot read"):
        builtin_speakers(str(old))


SPEAK_IN_A_FRESH_PROCESS = """
import json, sys
from convtts.config import Config, CosyVoiceConfig, SpeakerConfig, TTSConfig
from convtts.speak.cosyvoice.backend import CosyVoiceBackend
config = Config(
    speakers=SpeakerConfig(voices=("英文女",), policy="single"),
    tts=TTSConfig(backend="cosyvoice", cosyvoice=CosyVoiceConfig(model_dir=sys.argv[1])),
)
backend = CosyVoiceBackend(config)
audio = backend.synthesize(sys.argv[2], "英文女", 7)
print(json.dumps({
    "samples": len(audio),
    "transformers": "transformers" in sys.modules,
    "training_tools": sorted(n for n in ("lightning", "hydra", "matplotlib", "gdown") if n in sys.modules),
}))
"""


def test_a_v1_model_loads_and_speaks_without_importing_transformers_or_training_tools(model_dir, backend):
    # v1 never calls transformers; its import (torch._dynamo, sympy, torch.distributed) was most of a
    # worker's runtime import on a GPU node (convtts.speak.cosyvoice.standins); Matcha-TTS's training
    # tools come with its matcha.utils package (convtts.speak.cosyvoice.matcha_utils)
    seen = python_reports(SPEAK_IN_A_FRESH_PROCESS, model_dir, TEXT)
    counts = text_token_counts(backend.model.frontend, TEXT)
    assert seen == {"samples": expected_samples(counts, RATIO), "transformers": False, "training_tools": []}


PRELOAD_IN_A_FRESH_PROCESS = """
import json, os, sys
from convtts.run.preload import preload
args = {"runtime_root": "", "version": 1, "model_dir": sys.argv[1]}
preload({"whisper": False, "voice": {"function": "convtts.speak.cosyvoice.resources:preload", "args": args}})
import torch
print(json.dumps({
    "flow_decoder": "cosyvoice.flow.flow_matching" in sys.modules and "matcha.models.components.decoder" in sys.modules,
    "hift": "cosyvoice.hifigan.generator" in sys.modules,
    "transformers": "transformers" in sys.modules,
    "cuda_initialised": torch.cuda.is_initialized(),
    "nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
}))
"""


def test_the_forkserver_preload_imports_what_the_v1_yaml_names_but_not_transformers(model_dir):
    seen = python_reports(PRELOAD_IN_A_FRESH_PROCESS, model_dir)
    assert seen == {
        "flow_decoder": True,
        "hift": True,
        "transformers": False,
        "cuda_initialised": False,
        "nvml_check": "1",
    }
