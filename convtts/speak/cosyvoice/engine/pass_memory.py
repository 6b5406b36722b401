"""GPU memory of one flow or vocoder pass per row, from the model's widths: caps the rows of a pass, sizes workers.

The estimates count the activations alive at a pass's peak, per mel frame (flow) or per output
sample (vocoder), times FACTOR for what the count leaves out (allocator rounding, kernels'
workspaces, the cast copies of inputs). bench/flow_vocoder.py prints the estimate next to the
measured peak of each pass, so FACTOR can be checked on a GPU.

    flow_mb_per_row(version=1, precision="bf16", seconds=8.0)   # before a model is loaded
    flow_pass_mb(flow, "bf16", rows=32, frames=700)              # for a loaded flow
"""

from __future__ import annotations

import torch

from convtts.speak.cosyvoice.engine.precision import storage_dtype

FACTOR = 2.0
EULER_FLOATS = 8 * 80  # the solve's own tensors per frame: x, mask, mu, cond, their pairs, the update
MEL_RATE = {1: 22050 / 256, 2: 50.0, 3: 50.0}  # mel frames per second
SAMPLE_RATE = {1: 22050, 2: 24000, 3: 24000}
# The released estimators' widths (CosyVoice-300M, CosyVoice2-0.5B, Fun-CosyVoice3-0.5B).
RELEASED_FLOW = {
    1: dict(kind="unet", channels=256, inner=512, ff=1024),
    2: dict(kind="unet", channels=256, inner=512, ff=1024),
    3: dict(kind="dit", channels=1024, inner=1024, ff=2048),
}
RELEASED_HIFT = {
    1: dict(channels=128, hop=4, harmonics=9),
    2: dict(channels=64, hop=4, harmonics=9),
    3: dict(channels=64, hop=4, harmonics=9),
}


def bytes_of(precision: str) -> int:
    return torch.tensor([], dtype=storage_dtype(precision)).element_size()


def estimator_floats(kind: str, channels: int, inner: int, ff: int) -> int:
    """Activations alive per frame and per estimator row at the peak of one estimator call.

    U-Net: the skip tensors of both levels, then a transformer block's input, norm, q, k, v,
    attention output and projection, and its feed-forward's two inner tensors. DiT: a block's
    residual, norm, q, k, v, attention and projection, the feed-forward's norm, inner tensors and
    output. Attention runs in memory-efficient kernels (no frames x frames matrix).
    """
    if kind == "dit":
        return 7 * channels + 4 * inner + 2 * ff + 4 * 80
    return 5 * channels + 4 * inner + 2 * ff + 4 * 80


def estimator_widths(estimator) -> dict:
    """kind, channels, attention width and feed-forward width of a loaded estimator."""
    if type(estimator).__name__ == "DiT":
        block = estimator.transformer_blocks[0]
        return dict(kind="dit", channels=estimator.dim, inner=block.attn.inner_dim, ff=feed_forward_width(block.ff))
    block = estimator.down_blocks[0][1][0]
    channels = estimator.down_blocks[0][0].block1.block[0].out_channels
    return dict(kind="unet", channels=channels, inner=block.attn1.inner_dim, ff=feed_forward_width(block.ff))


def feed_forward_width(ff) -> int:
    """The inner width of a feed-forward: the widest input of its linear layers."""
    return max(m.in_features for m in ff.modules() if isinstance(m, torch.nn.Linear))


def flow_bytes_per_frame(widths: dict, precision: str) -> float:
    """One row's share of a flow pass's peak, per mel frame: two estimator rows (guidance) and the solve."""
    activations = 2 * estimator_floats(**widths) * bytes_of(precision)
    return FACTOR * (activations + EULER_FLOATS * 4)


def flow_pass_mb(flow, precision: str, rows: int, frames: int) -> float:
    """Peak MiB of a flow pass of `rows` rows padded to `frames` mel frames, for a loaded flow."""
    return rows * frames * flow_bytes_per_frame(estimator_widths(flow.decoder.estimator), precision) / 2**20


def flow_mb_per_row(version: int, precision: str, seconds: float, prompt_seconds: float = 0.0) -> float:
    """Peak MiB one row adds to a flow pass of the released model (no model loaded): for sizing workers."""
    frames = (seconds + prompt_seconds) * MEL_RATE[version]
    return frames * flow_bytes_per_frame(RELEASED_FLOW[version], precision) / 2**20


def rows_within(budget_mb: float, mb_per_row: float) -> int:
    """How many rows of that cost fit the budget (always at least one)."""
    return max(1, int(budget_mb // max(mb_per_row, 1e-9)))


def hift_widths(hift) -> dict:
    """Channels of HiFT's last (widest in time) level, its iSTFT hop, and its source's harmonics."""
    return dict(
        channels=hift.ups[-1].out_channels, hop=int(hift.istft_params["hop_len"]), harmonics=int(hift.nb_harmonics) + 1
    )


def vocoder_bytes_per_sample(widths: dict, precision: str) -> float:
    """One row's share of a vocoder pass's peak, per output sample.

    At the last level, per iSTFT frame: a resblock's input, its two activations and convolution
    outputs and the running sum (six tensors of the level's channels); per sample: the source's
    harmonics, noise and phases and the signal itself, in fp32.
    """
    level = 6 * widths["channels"] * bytes_of(precision) / widths["hop"]
    source = (3 * widths["harmonics"] + 4) * 4
    return FACTOR * (level + source)


def vocoder_pass_mb(hift, precision: str, rows: int, samples: int) -> float:
    """Peak MiB of a vocoder pass of `rows` rows padded to `samples` output samples, for a loaded HiFT."""
    return rows * samples * vocoder_bytes_per_sample(hift_widths(hift), precision) / 2**20


def vocoder_mb_per_row(version: int, precision: str, seconds: float) -> float:
    """Peak MiB one row adds to a vocoder pass of the released model (no model loaded)."""
    return seconds * SAMPLE_RATE[version] * vocoder_bytes_per_sample(RELEASED_HIFT[version], precision) / 2**20
