"""Libraries the runtime's import does not need, kept out of it (convtts.speak.cosyvoice.unused_imports;
torch._dynamo: convtts.speak.cosyvoice.deferred), each case in a fresh interpreter."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from conftest import need, python_reports

need("cosyvoice", "cosyvoice")
signal = need("scipy.signal", "cosyvoice")

KEPT_OUT = ("modelscope", "scipy.signal", "librosa.filters", "numba", "whisper.model", "scipy.io", "torch._dynamo")


@pytest.mark.parametrize("size", [2, 7, 16, 1024, 1920])
def test_the_hann_window_is_scipys_to_the_last_bit(size):
    from convtts.speak.cosyvoice.unused_imports import get_window

    ours, theirs = get_window("hann", size, fftbins=True), signal.get_window("hann", size, fftbins=True)
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    assert np.array_equal(get_window("hamming", size), signal.get_window("hamming", size))  # scipy's own


@pytest.mark.cosyvoice
def test_a_v1_model_loads_and_speaks_without_them_and_they_import_when_asked_for(tmp_path):
    """The slot's preload and a worker's whole life with a v1 model (load, a batch spoken) import
    none of them (torch._dynamo: diffusers' allow_in_graph falls back to its no-op); afterwards each
    is the real library."""
    from convtts.testing.cosyvoice_model import build_model_dir

    model = build_model_dir(tmp_path / "tiny", "tiny", ("英文女", "英文男"), tokens_per_text_token=4)
    seen = python_reports(
        textwrap.dedent(
            """
            import json, sys
            kept_out = sys.argv[2].split(",")
            def present():
                return sorted(name for name in kept_out if name in sys.modules)
            from convtts.run.preload import preload
            preload({"cosyvoice": True, "cosyvoice_root": "", "version": 1, "model_dir": sys.argv[1], "whisper": False})
            seen = {"after_preload": present(), "whisper": type(sys.modules["whisper"]).__name__}
            from convtts.config import Config, CosyVoiceConfig, SpeakerConfig, TTSConfig
            from convtts.speak.cosyvoice.backend import CosyVoiceBackend
            cosy = CosyVoiceConfig(model_dir=sys.argv[1], batch_size=2)
            voices = SpeakerConfig(voices=("英文女", "英文男"))
            config = Config(speakers=voices, tts=TTSConfig(backend="cosyvoice", cosyvoice=cosy))
            backend = CosyVoiceBackend(config)
            items = [(i, text, "英文女", 7 + i) for i, text in enumerate(["A cat sat.", "The boats came in."])]
            seen["samples"] = [len(audio) for _, audio in backend.synthesize_many(items)]
            seen["after_speaking"] = present()
            import torch
            from matcha.utils.audio import mel_spectrogram
            mel = mel_spectrogram(torch.zeros(1, 4800), 1024, 80, 22050, 256, 1024, 0, 8000, center=False)
            seen["mel"] = list(mel.shape)
            import numpy, soundfile
            from matcha.utils.audio import read
            soundfile.write(sys.argv[3], numpy.zeros(800, dtype="int16"), 16000, subtype="PCM_16")
            seen["wav"] = read(sys.argv[3])[0]
            import whisper
            seen["whisper_mel"] = list(whisper.log_mel_spectrogram(torch.zeros(16000), n_mels=128).shape)
            import scipy.signal
            import torch._dynamo
            seen["real"] = hasattr(scipy.signal, "lfilter") and hasattr(torch._dynamo, "allow_in_graph")
            seen["at_the_end"] = present()
            print(json.dumps(seen))
            """
        ),
        model,
        ",".join(KEPT_OUT),
        tmp_path / "quiet.wav",
    )
    assert seen["after_preload"] == [] and seen["after_speaking"] == [], seen
    assert seen["whisper"] == "LightPackage", seen
    assert len(seen["samples"]) == 2 and min(seen["samples"]) > 0, seen
    assert seen["mel"] == [1, 80, 18] and seen["whisper_mel"] == [128, 100] and seen["wav"] == 16000, seen
    assert seen["real"], seen
    asked_for = {"scipy.signal", "librosa.filters", "whisper.model", "scipy.io", "torch._dynamo"}
    assert asked_for <= set(seen["at_the_end"]), seen


def test_any_other_name_imports_the_real_module_at_once_and_the_stand_ins_go_after_the_block():
    seen = python_reports(
        textwrap.dedent(
            """
            import json, sys
            from convtts.config import ConfigError
            from convtts.speak.cosyvoice.unused_imports import StandIn, kept_out
            seen = {}
            with kept_out():
                from scipy.signal import get_window
                seen["stand_in"] = isinstance(sys.modules["scipy.signal"], StandIn)
                from scipy.signal import lfilter
                seen["real_after_lfilter"] = not isinstance(sys.modules["scipy.signal"], StandIn)
                from modelscope import snapshot_download
                try:
                    snapshot_download("iic/CosyVoice-300M")
                except ConfigError as exc:  # the refusal load_model puts in upstream's place too
                    seen["download"] = str(exc)
            seen["left"] = sorted(n for n in ("modelscope", "librosa.filters") if n in sys.modules)
            print(json.dumps(seen))
            """
        )
    )
    assert seen["stand_in"] and seen["real_after_lfilter"], seen
    assert "must exist locally" in seen["download"], seen
    assert seen["left"] == [], seen


def test_libraries_imported_already_are_left_alone():
    seen = python_reports(
        textwrap.dedent(
            """
            import json, sys
            import scipy.signal, whisper
            real_signal, real_whisper = sys.modules["scipy.signal"], sys.modules["whisper"]
            from convtts.speak.cosyvoice.unused_imports import kept_out
            with kept_out():
                import scipy.signal as inside
                seen = {"same": inside is real_signal and sys.modules["whisper"] is real_whisper}
            seen["still"] = sys.modules["scipy.signal"] is real_signal
            print(json.dumps(seen))
            """
        )
    )
    assert seen == {"same": True, "still": True}


def test_diffusers_reads_the_package_map_at_its_first_use():
    seen = python_reports(
        textwrap.dedent(
            """
            import importlib.metadata, json, sys
            read = importlib.metadata.packages_distributions
            from convtts.speak.cosyvoice.unused_imports import PackageMap, kept_out
            with kept_out():
                from diffusers.utils import import_utils
            found = import_utils._package_map
            seen = {"lazy": isinstance(found, PackageMap) and found._map is None}
            seen["restored"] = importlib.metadata.packages_distributions is read
            seen["same"] = dict(found) == read() and found.get("numpy") == read()["numpy"]
            print(json.dumps(seen))
            """
        )
    )
    assert seen == {"lazy": True, "restored": True, "same": True}
