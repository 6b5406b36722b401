"""v2's causal U-Net blocks after their convolution: bias, layer norm over each frame, Mish, mask and residual in one
Triton kernel.

v2's CausalBlock1D runs a causal convolution (its input padded on the left by a copy), then a
transpose, a layer norm over each frame's channels, a transpose back and Mish, and its caller masks
and adds the time embedding or the residual: some ten passes over (rows x channels x frames), with
copies for the padding and the transposed norm. On an H100 they were about a fifth of a v2 flow pass.
Here the convolution pads both sides itself (the first `frames` outputs are the causal ones), and one
program per row and run of frames reads its output once, with every channel of each frame in hand,
and writes the block's output once, in fp32 throughout.

The output is `(mish(layer_norm(conv + bias)) + add) * mask + residual`, as groupnorm.block_norm's:
where `add` is given the frames past a row's end are zero (upstream has the projection there; the
next block masks its input, so no frame of the row reads them).

Used where Triton runs and the kernel, once a process, compiled and agreed with upstream's modules
on a small case (`works`); elsewhere upstream's blocks run. The kernel runs in Triton's interpreter
in the tests.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.attention import available, kernel_agrees, triton

if triton is not None:
    import triton.language as tl

    from convtts.speak.cosyvoice.engine.groupnorm import _mish

    @triton.jit
    def _frame_norm(
        X,
        BIAS,
        WEIGHT,
        SHIFT,
        MASK,
        ADD,
        RESIDUAL,
        OUT,
        channels,
        frames,
        x_rows,  # X's strides between rows and between channels (its frames lie side by side)
        x_channels,
        masks,  # stride between two rows' masks
        adds,  # and between two rows' added vectors
        eps,
        HAS_ADD: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr,
        CHANNELS: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        at = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        channel = tl.arange(0, CHANNELS)
        in_frames, in_channels = at < frames, channel < channels
        inside = in_channels[:, None] & in_frames[None, :]
        x = tl.load(X + row * x_rows + channel[:, None] * x_channels + at[None, :], mask=inside, other=0.0)
        x = x.to(tl.float32) + tl.load(BIAS + channel, mask=in_channels, other=0.0).to(tl.float32)[:, None]
        mean = tl.sum(tl.where(inside, x, 0.0), axis=0) / channels
        centred = tl.where(inside, x - mean[None, :], 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / channels + eps)
        weight = tl.load(WEIGHT + channel, mask=in_channels, other=0.0).to(tl.float32)
        shift = tl.load(SHIFT + channel, mask=in_channels, other=0.0).to(tl.float32)
        y = _mish(centred * rstd[None, :] * weight[:, None] + shift[:, None])
        if HAS_ADD:
            y += tl.load(ADD + row * adds + channel, mask=in_channels, other=0.0).to(tl.float32)[:, None]
        y = y * tl.load(MASK + row * masks + at, mask=in_frames, other=0.0).to(tl.float32)[None, :]
        own = row * channels * frames + channel[:, None] * frames + at[None, :]
        if HAS_RESIDUAL:
            y += tl.load(RESIDUAL + own, mask=inside, other=0.0).to(tl.float32)
        tl.store(OUT + own, y.to(OUT.dtype.element_ty), mask=inside)


FRAMES = 16  # frames a program takes, each with all its channels


def causal_parts(block) -> tuple | None:
    """(conv, norm) of v2's CausalBlock1D (a causal convolution with a bias, a transpose, a LayerNorm, a
    transpose back, Mish), or None."""
    parts = list(getattr(block, "block", []))
    kinds = [type(part).__name__ for part in parts]
    if kinds != ["CausalConv1d", "Transpose", "LayerNorm", "Transpose", "Mish"]:
        return None
    conv, norm = parts[0], parts[2]
    plain = conv.stride == (1,) and conv.dilation == (1,) and conv.groups == 1 and conv.padding_mode == "zeros"
    causal = getattr(conv, "causal_padding", None) == conv.kernel_size[0] - 1
    affine = norm.weight is not None and norm.bias is not None and len(norm.normalized_shape) == 1
    return (conv, norm) if plain and causal and affine and conv.bias is not None else None


def causal_conv(conv, x: torch.Tensor) -> torch.Tensor:
    """The causal convolution of x without its bias: padded on both sides by the convolution itself, its first
    `frames` outputs are those of the input padded on the left (a view: no copy of the input or the output)."""
    out = F.conv1d(x, conv.weight, None, padding=conv.causal_padding)
    return out[:, :, : x.shape[2]]


def frame_block(parts, x, mask, add=None, residual=None) -> torch.Tensor:
    """A CausalBlock1D's (conv, norm) on x, already masked: `(mish(norm(conv(x))) + add) * mask + residual`."""
    conv, norm = parts
    add = add.contiguous() if add is not None else None
    residual = residual.contiguous() if residual is not None else None
    return frame_norm(causal_conv(conv, x), conv.bias, norm, mask, add, residual)


def frame_norm(x, bias, norm, mask, add=None, residual=None) -> torch.Tensor:
    """The kernel on a convolution's output x (rows, channels, frames; frames side by side) without its bias;
    mask (rows, 1, frames); `add` (rows, channels) and `residual` (like x, contiguous) may be None."""
    rows, channels, frames = x.shape
    out = torch.empty(rows, channels, frames, device=x.device, dtype=x.dtype)
    _frame_norm[(rows, triton.cdiv(frames, FRAMES))](
        x,
        bias,
        norm.weight,
        norm.bias,
        mask,
        add if add is not None else bias,
        residual if residual is not None else out,
        out,
        channels,
        frames,
        x.stride(0),
        x.stride(1),
        mask.stride(0),
        add.stride(0) if add is not None else 0,
        norm.eps,
        HAS_ADD=add is not None,
        HAS_RESIDUAL=residual is not None,
        CHANNELS=triton.next_power_of_2(channels),
        BLOCK=FRAMES,
    )
    return out


def fits(parts, x, mask) -> bool:
    """Whether the kernel takes this block's work: the block as causal_parts reads it, activations in the
    block's own format, a row's mask side by side, and the kernel working here."""
    if parts is None or not available(x.device):
        return False
    conv, norm = parts
    vectors = (conv.bias, norm.weight, norm.bias)
    return (
        x.dtype == conv.weight.dtype
        and mask.shape == (x.shape[0], 1, x.shape[2])
        and mask.stride(2) == 1
        and all(v.is_contiguous() for v in vectors)
        and norm.normalized_shape[0] <= 1024
        and works(str(x.device), x.dtype)
    )


@functools.cache
def works(device: str, dtype: torch.dtype) -> bool:
    """Whether the kernel compiles and agrees with upstream's CausalBlock1D here in this format (with and
    without the added vector and the residual, a row of fewer frames than the pass): otherwise v2's
    U-Net keeps upstream's blocks. Asked once per process, before any graph capture."""
    return kernel_agrees("the frame-norm kernel", "v2's U-Net", dtype, functools.partial(gap, device, dtype))


def torch_frame_block(parts, x, mask, add=None, residual=None) -> torch.Tensor:
    """frame_block as upstream's modules compute it (x padded on the left, the convolution, the norm over each
    frame's channels, Mish, in x's format), then the added vector, the mask and the residual."""
    conv, norm = parts
    y = F.conv1d(F.pad(x, (conv.causal_padding, 0)), conv.weight, conv.bias)
    y = F.mish(F.layer_norm(y.transpose(1, 2), norm.normalized_shape, norm.weight, norm.bias, norm.eps).transpose(1, 2))
    if add is not None:
        y = y + add[:, :, None]
    y = y * mask
    return y if residual is None else y + residual


@torch.inference_mode()
def gap(device: str, dtype: torch.dtype) -> float:
    """works' measure: the kernel against torch_frame_block on a small case, the largest gap of full scale."""
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    conv = torch.nn.Conv1d(12, 24, 3).to(device=device, dtype=dtype)
    conv.causal_padding = 2
    norm = torch.nn.LayerNorm(24).to(device=device, dtype=dtype)
    with torch.no_grad():
        conv.weight.copy_(randn(24, 12, 3))
        conv.bias.copy_(randn(24))
        norm.weight.copy_(randn(24) * 0.5 + 1)
        norm.bias.copy_(randn(24))
    x, add, residual = randn(2, 12, 40) * 3 + 1, randn(2, 24), randn(2, 24, 40)
    mask = torch.ones(2, 1, 40, device=device, dtype=dtype)
    mask[1, :, 25:] = 0
    x = x * mask
    worst = 0.0
    for extra in ((None, None), (add, residual)):
        got = frame_block((conv, norm), x, mask, *extra).float()
        want = torch_frame_block((conv, norm), x, mask, *extra).float()
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    return worst
