"""What a flow pass and a vocoder pass cost on a kind of GPU: the engine's own calibration, for cutting
rows into passes (tts.cosyvoice.flow.grouping cost), measured with bench/pass_cost.py (--fit prints an
entry for this table). Not a user setting: the tts.cosyvoice.flow keys of the same names override it
where set. A GPU kind not measured takes the H200's figures for its flow, which rank cuts the same way
wherever a pass's fixed price and its work keep their proportion."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PassCosts:
    """What one pass costs apart from its size, and per padded row-frame."""

    pass_ms: float
    frame_us: float
    replay_ms: float | None = None  # a pass that replays a CUDA graph (None: no graphs)
    capture_ms: float | None = None  # a pass that captures its graph (None: as an eager one)

    def seconds(self, row_frames: int, replayed: bool = False, captured: bool = False) -> float:
        fixed = self.pass_ms
        if replayed and self.replay_ms is not None:
            fixed = self.replay_ms
        elif captured and self.capture_ms is not None:
            fixed = self.capture_ms
        return (fixed + self.frame_us * row_frames / 1000) / 1000


@dataclass(frozen=True)
class Profile:
    flow: PassCosts
    vocoder: PassCosts
    measured: str  # on what, and how


UNET, DIT = "ConditionalDecoder", "DiT"  # the flow estimators: v1 and v2's U-Net, v3's transformer
MEASURED = {
    ("H200", UNET): Profile(
        # an eager solve 0.4-1.3 s whatever its size (launch-bound), a replayed graph 60 ms, one that
        # captures its step first 130-190 ms more; a vocoder pass 11-16 ms
        PassCosts(pass_ms=700.0, frame_us=18.0, replay_ms=60.0, capture_ms=220.0),
        PassCosts(pass_ms=12.0, frame_us=7.5),
        "H200, bf16 CosyVoice-300M, bench/pass_cost.py",
    ),
    ("H200", DIT): Profile(
        # bound by the GPU's work: a pass's own price small beside the U-Net's, a padded row-frame dearer
        PassCosts(pass_ms=20.0, frame_us=36.0, replay_ms=12.0, capture_ms=90.0),
        PassCosts(pass_ms=12.0, frame_us=7.5),
        "H200, bf16 Fun-CosyVoice3-0.5B, bench/pass_cost.py",
    ),
}
FALLBACK_KIND = "H200"


def profile(device_name: str, estimator: str) -> Profile:
    """The measured profile of this GPU kind (by its name, as torch reports it) and flow estimator, or
    the fallback kind's; a CPU takes it too (its passes cost more, in the same proportion roughly)."""
    name = device_name.upper()
    flow = estimator if any(key[1] == estimator for key in MEASURED) else UNET
    for (kind, of), measured in MEASURED.items():
        if of == flow and kind in name:
            return measured
    return MEASURED[(FALLBACK_KIND, flow)]


def configured(profile_: Profile, flow_config) -> tuple[PassCosts, PassCosts]:
    """The profile's costs, with those tts.cosyvoice.flow sets in their place."""

    def given(name, default):
        value = getattr(flow_config, name)
        return default if value is None else value

    f, v = profile_.flow, profile_.vocoder
    flow = PassCosts(
        given("pass_ms", f.pass_ms), given("frame_us", f.frame_us), given("replay_ms", f.replay_ms),
        given("capture_ms", f.capture_ms),
    )  # fmt: skip
    vocoder = PassCosts(given("vocoder_pass_ms", v.pass_ms), given("vocoder_frame_us", v.frame_us))
    return flow, vocoder
