"""The shipped CosyVoice configs' number formats: a vocoder that keeps fp32 activations, bf16 one setting away,
and a CosyVoice3 flow in fp16 refused before any work."""

from __future__ import annotations

import pytest

from conftest import REPO
from convtts.config import ConfigError, load_config

SHIPPED = sorted((REPO / "configs").glob("cosyvoice*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_the_vocoder_ships_in_tf32_and_bf16_is_one_setting_away(path):
    precision = load_config(path).tts.cosyvoice.precision
    assert (precision.llm, precision.flow, precision.vocoder) == ("bf16", "bf16", "tf32")
    faster = load_config(path, ["tts.cosyvoice.precision.vocoder=bf16"]).tts.cosyvoice.precision
    assert (faster.llm, faster.flow, faster.vocoder) == ("bf16", "bf16", "bf16")


def model_dir(tmp_path, version: int):
    """A directory named as a model of this version is (runtime.VERSION_YAML): all the check reads."""
    folder = tmp_path / f"v{version}"
    folder.mkdir()
    (folder / {1: "cosyvoice.yaml", 2: "cosyvoice2.yaml", 3: "cosyvoice3.yaml"}[version]).write_text("{}\n")
    return folder


@pytest.mark.parametrize("setting", ["tts.cosyvoice.precision.flow=fp16", "tts.cosyvoice.fp16=true"])
def test_a_cosyvoice3_flow_in_fp16_is_refused_with_its_reason(tmp_path, setting):
    v3 = [f"tts.cosyvoice.model_dir={model_dir(tmp_path, 3)}", setting]
    with pytest.raises(ConfigError, match=r"overflows to NaN .*issues/1873.*allow_fp16_flow"):
        load_config("cosyvoice3", v3)
    allowed = load_config("cosyvoice3", [*v3, "tts.cosyvoice.allow_fp16_flow=true"]).tts.cosyvoice
    assert allowed.precision.flow == "fp16" or allowed.fp16


@pytest.mark.parametrize("version", [1, 2])
def test_fp16_stays_open_to_the_v1_and_v2_flows(tmp_path, version):
    name = "cosyvoice" if version == 1 else "cosyvoice2"
    sets = [f"tts.cosyvoice.model_dir={model_dir(tmp_path, version)}", "tts.cosyvoice.precision.flow=fp16"]
    assert load_config(name, sets).tts.cosyvoice.precision.flow == "fp16"
