"""The import stand-ins (convtts.speak.cosyvoice.standins): what each keeps out of the runtime's import,
that each library comes back at its first use, and that the installed runtime asks them for no name
they do not serve. Each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import COSYVOICE_CHECKOUT, need, python_reports, script_env

need("cosyvoice", "cosyvoice")
need("transformers", "cosyvoice")
signal = need("scipy.signal", "cosyvoice")

PRELUDE = """
import json, sys
from convtts.speak.cosyvoice.standins import Placeholder, transformers_deferred
from convtts.speak.cosyvoice.standins import TransformersStandIn as StandIn
def real():
    module = sys.modules.get("transformers")
    return module is not None and not isinstance(module, StandIn)
seen = {}
"""


def run(body: str) -> dict:
    return python_reports(PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(seen))\n")


def test_names_wait_for_their_first_use_and_the_stand_in_goes_after_the_block():
    seen = run(
        """
        with transformers_deferred():
            from transformers import AutoTokenizer, Qwen2ForCausalLM
            import importlib.util
            seen["spec_found"] = importlib.util.find_spec("transformers") is not None
            seen["inside"] = real()
        seen["placeholders"] = isinstance(Qwen2ForCausalLM, Placeholder) and isinstance(AutoTokenizer, Placeholder)
        seen["after_block"] = "transformers" in sys.modules
        loader = Qwen2ForCausalLM.from_pretrained
        import transformers
        seen["first_use"] = real() and loader.__func__ is transformers.Qwen2ForCausalLM.from_pretrained.__func__
        """
    )
    assert seen == {"spec_found": True, "inside": False, "placeholders": True, "after_block": False, "first_use": True}


@pytest.mark.parametrize(
    "statement",
    [
        "import transformers; version = transformers.__version__",
        "from transformers.modeling_outputs import BaseModelOutput as version",
        "import types; from transformers import PreTrainedModel; version = types.new_class('Mine', (PreTrainedModel,))",
    ],
    ids=["dunder", "submodule", "subclass"],
)
def test_what_needs_the_library_now_imports_it_at_once(statement):
    seen = run(
        f"""
        with transformers_deferred():
            {statement}
            seen["real"] = real()
            seen["stand_in_left"] = isinstance(version, (Placeholder, StandIn))
        import transformers
        seen["one_module"] = sys.modules["transformers"] is transformers and not isinstance(transformers, StandIn)
        """
    )
    assert seen == {"real": True, "stand_in_left": False, "one_module": True}


def test_nothing_is_held_back_once_transformers_is_imported():
    seen = run(
        """
        import transformers
        with transformers_deferred():
            from transformers import AutoTokenizer
        seen["real_class"] = AutoTokenizer is transformers.AutoTokenizer
        """
    )
    assert seen == {"real_class": True}


def test_placeholders_left_in_modules_are_swapped_for_the_classes():
    seen = run(
        """
        import types
        from convtts.speak.cosyvoice.standins import resolve_placeholders
        with transformers_deferred():
            from transformers import Qwen2ForCausalLM
        holder = types.ModuleType("cosyvoice_like.llm")
        holder.Qwen2ForCausalLM = Qwen2ForCausalLM
        sys.modules["cosyvoice_like.llm"] = holder
        resolve_placeholders("cosyvoice_like")
        import transformers
        seen["swapped"] = holder.Qwen2ForCausalLM is transformers.Qwen2ForCausalLM
        """
    )
    assert seen == {"swapped": True}


def test_a_placeholder_answers_isinstance_as_its_class():
    seen = run(
        """
        with transformers_deferred():
            from transformers import CLIPTextModel
        seen["not_one"] = isinstance(object(), (CLIPTextModel, int))
        import transformers
        seen["real"] = issubclass(transformers.CLIPTextModel, CLIPTextModel)
        """
    )
    assert seen == {"not_one": False, "real": True}


def test_torch_dynamo_already_imported_is_left_alone():
    seen = run(
        """
        import torch._dynamo
        from convtts.speak.cosyvoice.standins import dynamo_hidden
        with dynamo_hidden():
            import torch._dynamo as inside
        seen["same"] = inside is sys.modules["torch._dynamo"] and hasattr(inside, "allow_in_graph")
        with dynamo_hidden(False):
            pass
        seen["still"] = sys.modules["torch._dynamo"] is not None
        """
    )
    assert seen == {"same": True, "still": True}


# -- libraries no voice needs as it loads ------------------------------------------------------------

KEPT_OUT = ("modelscope", "scipy.signal", "librosa.filters", "numba", "whisper.model", "scipy.io", "torch._dynamo")


@pytest.mark.parametrize("size", [2, 7, 16, 1024, 1920])
def test_the_hann_window_is_scipys_to_the_last_bit(size):
    from convtts.speak.cosyvoice.standins import get_window

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
            args = {"runtime_root": "", "version": 1, "model_dir": sys.argv[1]}
            voice = {"function": "convtts.speak.cosyvoice.resources:preload", "args": args}
            preload({"whisper": False, "voice": voice})
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


@pytest.mark.cosyvoice
@pytest.mark.parametrize("standins", [True, False])
def test_tts_cosyvoice_standins_false_imports_the_runtime_as_upstream_does(tmp_path, standins):
    """The switch: a slot's preload of a v1 model with tts.cosyvoice.standins false imports every
    library the runtime names (the real transformers among them); true keeps them out."""
    from convtts.testing.cosyvoice_model import build_model_dir

    model = build_model_dir(tmp_path / "tiny", "tiny", ("英文女", "英文男"), tokens_per_text_token=4)
    body = """
        import json, sys
        from convtts.run.preload import preload
        args = {"runtime_root": "", "version": 1, "model_dir": sys.argv[1], "standins": sys.argv[2] == "True"}
        preload({"whisper": False, "voice": {"function": "convtts.speak.cosyvoice.resources:preload", "args": args}})
        kept_out = sys.argv[3].split(",")
        transformers = sys.modules.get("transformers")
        print(json.dumps({
            "present": sorted(name for name in kept_out if name in sys.modules),
            "transformers": type(transformers).__name__ if transformers else None,
            "real": hasattr(transformers, "PreTrainedModel") if transformers else False,
        }))
    """
    seen = python_reports(textwrap.dedent(body), model, str(standins), ",".join(KEPT_OUT))
    if standins:
        assert seen["present"] == [] and not seen["real"], seen
    else:
        assert {"scipy.signal", "torch._dynamo", "modelscope"} <= set(seen["present"]) and seen["real"], seen


def test_any_other_name_imports_the_real_module_at_once_and_the_stand_ins_go_after_the_block():
    seen = python_reports(
        textwrap.dedent(
            """
            import json, sys
            from convtts.config import ConfigError
            from convtts.speak.cosyvoice.standins import StandIn, kept_out
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
            from convtts.speak.cosyvoice.standins import kept_out
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
            from convtts.speak.cosyvoice.standins import PackageMap, kept_out
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


# -- the installed runtime against what the stand-ins serve -------------------------------------------

ASKED_OF_STAND_INS = """
import json, sys
from convtts.speak.cosyvoice import standins
asked = []
served = standins.StandIn.__getattr__
def watched(self, name):
    if not name.startswith("__"):
        asked.append(f"{self.__name__}.{name}")  # a name no stand-in serves: the library imports now
    return served(self, name)
standins.StandIn.__getattr__ = watched
from convtts.config import CosyVoiceConfig
from convtts.speak.cosyvoice.runtime import import_model_modules, import_runtime
version, model_dir, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import_runtime(CosyVoiceConfig(runtime_root=root), version)
import_model_modules(model_dir, version)
held = ["modelscope", "scipy.signal", "librosa.filters", "scipy.io", "whisper.model", "numba"]
if version == 1:
    held += ["transformers.utils", "torch._dynamo"]
print(json.dumps({"asked": asked, "imported": [n for n in held if type(sys.modules.get(n)).__name__ == "module"]}))
"""


@pytest.mark.cosyvoice
@pytest.mark.parametrize("version, runtime", [(1, "installed"), (2, "installed"), (3, "checkout")])
def test_the_runtime_asks_the_stand_ins_for_nothing_they_do_not_serve(tmp_path, version, runtime):
    """The runtime's import and its model's modules, as a slot's forkserver imports them: a name asked of a
    stand-in that it does not serve would import the whole library after all (the stand-in then saves
    nothing) and means the runtime changed: serve the name in standins._served, or drop the stand-in."""
    if runtime == "checkout" and not COSYVOICE_CHECKOUT:
        pytest.skip("needs a checkout of the official CosyVoice repository: COSYVOICE_ROOT=/path/to/CosyVoice")
    root = COSYVOICE_CHECKOUT if runtime == "checkout" else ""
    model = tmp_path / f"v{version}"
    env = script_env(COSYVOICE_ROOT=root)  # the model is written in a process of its own, by the same runtime
    args = ["--version", version, "--size", "tiny", "--out", model]
    write = [sys.executable, "-m", "convtts.testing.cosyvoice_model", *map(str, args)]
    subprocess.run(write, env=env, check=True, capture_output=True, timeout=600)
    seen = python_reports(ASKED_OF_STAND_INS, version, model, root)
    assert seen == {"asked": [], "imported": []}, (
        f"the installed runtime asked for names the stand-ins do not serve, or imported what they hold back: {seen}"
    )
