"""Matcha-TTS's matcha.utils without its training tools (convtts.speak.cosyvoice.matcha_utils), in fresh
interpreters: the flow's modules import, the tools stay out until something asks for them."""

from __future__ import annotations

import pytest

from conftest import python_reports

pytestmark = pytest.mark.cosyvoice

TOOLS = ("lightning", "hydra", "matplotlib", "gdown", "rich")

FLOW_THEN_TOOLS = f"""
import json, sys
from convtts.speak.cosyvoice import matcha_utils
tools = {TOOLS!r}
installed = matcha_utils.install()
from matcha.models.components.flow_matching import BASECFM
from matcha.utils.audio import mel_spectrogram
from matcha.utils.pylogger import get_pylogger
import pydoc
located = pydoc.locate("matcha.utils.audio.mel_spectrogram") is mel_spectrogram  # as a model's yaml names it
log = get_pylogger("probe")
before = sorted(n for n in tools if n in sys.modules)
from matcha.utils import instantiate_callbacks  # a training tool: the package's own __init__ runs now
print(json.dumps({{
    "installed": installed,
    "again": matcha_utils.install(),
    "before": before,
    "after": sorted(n for n in tools if n in sys.modules),
    "logger": log.name,
    "callbacks": callable(instantiate_callbacks),
    "flow": BASECFM.__module__,
    "located": located,
}}))
"""


def test_the_flow_imports_without_matchas_training_tools_and_they_come_when_asked_for():
    seen = python_reports(FLOW_THEN_TOOLS)
    assert seen["installed"] is True and seen["again"] is False
    assert seen["before"] == []
    assert {"lightning", "hydra"} <= set(seen["after"])
    assert seen["logger"] == "probe" and seen["callbacks"] is True
    assert seen["flow"] == "matcha.models.components.flow_matching" and seen["located"] is True


def test_nothing_is_replaced_once_matcha_utils_was_imported():
    seen = python_reports(
        "import json, sys, matcha.utils\n"
        "from convtts.speak.cosyvoice import matcha_utils\n"
        "print(json.dumps({'installed': matcha_utils.install(), 'kind': type(sys.modules['matcha.utils']).__name__}))"
    )
    assert seen == {"installed": False, "kind": "module"}
