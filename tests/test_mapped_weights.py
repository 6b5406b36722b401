"""A model's weights phase maps its checkpoints from the page cache (tts.cosyvoice.map_weights), through
upstream's own load of each file, on tiny random models loaded by the installed runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from convtts.config import CosyVoiceConfig
from convtts.testing.cosyvoice_model import build_model_dir

CHECKPOINTS = ("llm.pt", "flow.pt", "hift.pt")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """version -> a tiny model directory, written on first use."""
    made = {}

    def get(version: int) -> Path:
        if version not in made:
            out = tmp_path_factory.mktemp(f"mapped{version}") / "tiny"
            speakers = ["a"] if version == 1 else []
            made[version] = build_model_dir(out, "tiny", speakers, tokens_per_text_token=3, version=version)
        return made[version]

    return get


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "read"])
@pytest.mark.parametrize("version", [1, 2])
def test_the_weights_phase_maps_each_checkpoint_only_when_asked(model_dirs, monkeypatch, version, mapped):
    """Upstream loads llm.pt, flow.pt and hift.pt through torch.load by path: mapped, each comes to the CPU
    from the page cache (mmap) whatever device upstream asks for; with map_weights false upstream's own
    call is untouched. Either way the modules hold the checkpoint's weights and torch.load is restored."""
    from convtts.speak.cosyvoice.runtime import load_model

    folder = model_dirs(version)
    real, calls = torch.load, {}

    def recorded(f, *args, **kwargs):
        if isinstance(f, (str, Path)):
            calls[Path(f).name] = (kwargs.get("mmap"), kwargs.get("map_location"))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", recorded)
    model = load_model(CosyVoiceConfig(model_dir=str(folder), map_weights=mapped))
    assert torch.load is recorded  # put back as it was found
    missing = [name for name in CHECKPOINTS if name not in calls]
    assert not missing, f"upstream no longer loads {missing} through torch.load by path: {sorted(calls)}"
    for name in CHECKPOINTS:
        mmap, where = calls[name]
        if mapped:
            assert mmap is True and where == "cpu", (name, calls[name])
        else:
            assert not mmap and where != "cpu", (name, calls[name])  # upstream passes its device
    state = real(folder / "flow.pt", map_location="cpu", weights_only=True)
    flow = model.model.flow.state_dict()
    assert state.keys() == flow.keys()
    for key in list(state)[:: max(1, len(state) // 8)]:
        torch.testing.assert_close(flow[key].cpu(), state[key], rtol=0, atol=0)
