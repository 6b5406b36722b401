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
