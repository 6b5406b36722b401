"""transformers held back while a v1 runtime imports (convtts.speak.cosyvoice.deferred), in a fresh interpreter each."""

from __future__ import annotations

import textwrap

import pytest

from conftest import need, python_reports

need("transformers", "cosyvoice")

PRELUDE = """
import json, sys
from convtts.speak.cosyvoice.deferred import Placeholder, StandIn, transformers_deferred
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
        from convtts.speak.cosyvoice.deferred import resolve_placeholders
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


@pytest.mark.cosyvoice
def test_a_v1_worker_loads_and_speaks_without_torch_dynamo(tmp_path):
    """The slot's preload and a worker's whole life with a v1 model (load, a batch spoken) never import
    torch._dynamo (diffusers' allow_in_graph falls back to its no-op), and after the runtime's import
    `import torch._dynamo` is the real module."""
    from convtts.testing.cosyvoice_model import build_model_dir

    model = build_model_dir(tmp_path / "tiny", "tiny", ("英文女", "英文男"), tokens_per_text_token=4)
    seen = python_reports(
        """
        import json, sys
        from convtts.run.preload import preload
        preload({"cosyvoice": True, "cosyvoice_root": "", "version": 1, "model_dir": sys.argv[1], "whisper": False})
        seen = {"after_preload": "torch._dynamo" in sys.modules}
        from convtts.config import Config, CosyVoiceConfig, SpeakerConfig, TTSConfig
        from convtts.speak.cosyvoice.backend import CosyVoiceBackend
        cosy = CosyVoiceConfig(model_dir=sys.argv[1], batch_size=2)
        voices = SpeakerConfig(voices=("英文女", "英文男"))
        config = Config(speakers=voices, tts=TTSConfig(backend="cosyvoice", cosyvoice=cosy))
        backend = CosyVoiceBackend(config)
        items = [(i, text, "英文女", 7 + i) for i, text in enumerate(["A cat sat.", "The boats came in."])]
        seen["samples"] = [len(audio) for _, audio in backend.synthesize_many(items)]
        seen["after_speaking"] = "torch._dynamo" in sys.modules
        import torch._dynamo
        seen["real_afterwards"] = hasattr(torch._dynamo, "allow_in_graph")
        print(json.dumps(seen))
        """.replace("\n        ", "\n"),
        model,
    )
    assert seen["after_preload"] is False and seen["after_speaking"] is False, seen
    assert len(seen["samples"]) == 2 and min(seen["samples"]) > 0, seen
    assert seen["real_afterwards"], seen


def test_torch_dynamo_already_imported_is_left_alone():
    seen = run(
        """
        import torch._dynamo
        from convtts.speak.cosyvoice.deferred import dynamo_hidden
        with dynamo_hidden():
            import torch._dynamo as inside
        seen["same"] = inside is sys.modules["torch._dynamo"] and hasattr(inside, "allow_in_graph")
        with dynamo_hidden(False):
            pass
        seen["still"] = sys.modules["torch._dynamo"] is not None
        """
    )
    assert seen == {"same": True, "still": True}
