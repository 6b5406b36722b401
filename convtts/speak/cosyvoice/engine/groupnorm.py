"""v1's U-Net blocks after their convolution: bias, masked group norm, Mish, mask and residual as one Triton kernel.

A ResnetBlock1D of v1's estimator runs two Block1D (a convolution, a group norm, Mish) with the time
embedding added between them and a 1x1 convolution's residual added at the end. In torch, with
the group norm's statistics over each row's own frames (masked_group_norm below), that is some
twenty small kernels after each convolution, each a pass over (rows x channels x frames): on an
H200 they, with the blocks' other elementwise work, cost more of a flow pass than its matrix
products. Here one program per row and group reads the convolution's output three times (its mean,
its spread about the mean, the result) and writes the block's output once, in fp32 throughout.

The output is `(mish(norm(conv + bias)) + add) * mask + residual`: `add` is one vector a row (the
time embedding's projection), `residual` a tensor like the output. Where `add` is given the frames
past a row's end are zero, where upstream has the projection there; the next block masks its input
before its convolution, so no frame of the row reads them.

Used where Triton runs and the kernel, once a process, compiled and agreed with the torch path on a
small case (`works`); elsewhere, and as the reference in tests, `torch_block_norm`. The kernel runs
in Triton's interpreter in the tests.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.attention import available, kernel_agrees, triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _mish(x):
        """x * tanh(softplus(x)), with tanh(log(1 + n)) = (n^2 + 2n) / (n^2 + 2n + 2) for n = e^x; past 20,
        where torch's softplus is x itself, x."""
        n = tl.exp(tl.minimum(x, 20.0))
        square = n * (n + 2.0)
        return tl.where(x > 20.0, x, x * square / (square + 2.0))

    @triton.jit
    def _biased(X, BIAS, MASK, row, masks, base, first, at, frames, size):
        """The convolution's output with its bias at `at` (fp32), the row's mask there, and which are inside."""
        inside = at < size
        keep = tl.load(MASK + row * masks + at % frames, mask=inside, other=0.0).to(tl.float32)
        x = tl.load(X + base + at, mask=inside, other=0.0).to(tl.float32)
        x += tl.load(BIAS + first + at // frames, mask=inside, other=0.0).to(tl.float32)
        return x, keep, inside

    @triton.jit
    def _block_norm(
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
        per_group,
        masks,  # stride between two rows' masks
        adds,  # and between two rows' added vectors
        eps,
        HAS_ADD: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        program = tl.program_id(0).to(tl.int64)
        groups = channels // per_group
        row = program // groups
        first = (program % groups) * per_group
        base = (row * channels + first) * frames  # a group's channels lie side by side, frames innermost
        size = per_group * frames
        total = tl.zeros([BLOCK], dtype=tl.float32)
        kept = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, size, BLOCK):
            at = start + tl.arange(0, BLOCK)
            x, keep, inside = _biased(X, BIAS, MASK, row, masks, base, first, at, frames, size)
            total += x * keep
            kept += keep
        count = tl.maximum(tl.sum(kept, axis=0), 1.0 * per_group)  # a row of no frames counts one, as torch's
        mean = tl.sum(total, axis=0) / count
        spread = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, size, BLOCK):
            at = start + tl.arange(0, BLOCK)
            x, keep, inside = _biased(X, BIAS, MASK, row, masks, base, first, at, frames, size)
            centred = (x - mean) * keep
            spread += centred * centred
        rstd = tl.rsqrt(tl.sum(spread, axis=0) / count + eps)
        for start in range(0, size, BLOCK):
            at = start + tl.arange(0, BLOCK)
            x, keep, inside = _biased(X, BIAS, MASK, row, masks, base, first, at, frames, size)
            channel = first + at // frames
            weight = tl.load(WEIGHT + channel, mask=inside, other=0.0).to(tl.float32)
            shift = tl.load(SHIFT + channel, mask=inside, other=0.0).to(tl.float32)
            y = _mish((x - mean) * rstd * weight + shift)
            if HAS_ADD:
                y += tl.load(ADD + row * adds + channel, mask=inside, other=0.0).to(tl.float32)
            y = y * keep
            if HAS_RESIDUAL:
                y += tl.load(RESIDUAL + base + at, mask=inside, other=0.0).to(tl.float32)
            tl.store(OUT + base + at, y.to(OUT.dtype.element_ty), mask=inside)


def block_norm(x, bias, norm, mask, add=None, residual=None, kernel: bool | None = None):
    """`(mish(norm(x + bias)) + add) * mask + residual` for a convolution's output x (rows, channels, frames)
    without its bias, the group norm's statistics over each row's frames (mask (rows, 1, frames), 1 on
    them); `add` (rows, channels) and `residual` (like x) may be None. `kernel` None: Triton where it runs."""
    if kernel is None:
        kernel = fits(x, bias, norm, mask, add, residual)
    if not kernel:
        return torch_block_norm(x, bias, norm, mask, add, residual)
    rows, channels, frames = x.shape
    out = torch.empty_like(x)
    _block_norm[(rows * norm.num_groups,)](
        x,
        bias,
        norm.weight,
        norm.bias,
        mask,
        add if add is not None else bias,
        residual if residual is not None else x,
        out,
        channels,
        frames,
        channels // norm.num_groups,
        mask.stride(0),
        add.stride(0) if add is not None else 0,
        norm.eps,
        HAS_ADD=add is not None,
        HAS_RESIDUAL=residual is not None,
        BLOCK=1024,
    )
    return out


def masked_group_norm(x: torch.Tensor, norm: torch.nn.GroupNorm, mask: torch.Tensor) -> torch.Tensor:
    """GroupNorm with each row's statistics over its own frames (mask (rows, 1, frames), 1 on them), in fp32;
    a row of no frames counts one."""
    b, c, t = x.shape
    g = norm.num_groups
    values = x.float().view(b, g, c // g, t)
    keep = mask.float().view(b, 1, 1, t)
    count = keep.sum(dim=3, keepdim=True).clamp(min=1.0) * (c // g)
    mean = (values * keep).sum(dim=(2, 3), keepdim=True) / count
    centred = values - mean
    var = (centred.square() * keep).sum(dim=(2, 3), keepdim=True) / count
    out = (centred * torch.rsqrt(var + norm.eps)).view(b, c, t)
    return (out * norm.weight.float()[:, None] + norm.bias.float()[:, None]).to(x.dtype)


def torch_block_norm(x, bias, norm, mask, add=None, residual=None):
    """The same in torch: the group norm in fp32 (masked_group_norm), the rest in x's format."""
    y = F.mish(masked_group_norm(x + bias[:, None], norm, mask))
    if add is not None:
        y = y + add[:, :, None]
    y = y * mask
    return y if residual is None else y + residual


def fits(x, bias, norm, mask, add=None, residual=None) -> bool:
    """Whether the kernel takes these: contiguous activations, a row's mask and vector side by side."""
    tensors = [x] + ([residual] if residual is not None else [])
    return (
        available(x.device)
        and bias is not None
        and norm.affine
        and all(t.is_contiguous() and t.dtype == x.dtype for t in tensors)
        and (residual is None or residual.shape == x.shape)
        and mask.shape == (x.shape[0], 1, x.shape[2])
        and mask.stride(2) == 1
        and (add is None or add.stride(1) == 1)
        and all(v.is_contiguous() for v in (bias, norm.weight, norm.bias))
        and works(str(x.device), x.dtype)
    )


@functools.cache
def works(device: str, dtype: torch.dtype) -> bool:
    """Whether the kernel compiles and agrees with the torch path here in this format (with and without the
    added vector and the residual, rows of fewer frames than the pass): a GPU it cannot compile for, or
    computes wrongly on, leaves the U-Net to torch instead of failing every pass. Asked once per process,
    before any graph capture (a process's first flow step runs eagerly)."""
    return kernel_agrees(
        "the block-norm kernel", "the U-Net's resnet blocks", dtype, functools.partial(gap, device, dtype)
    )


@torch.inference_mode()
def gap(device: str, dtype: torch.dtype) -> float:
    """works' measure: the kernel against torch_block_norm on a small case, the largest gap of full scale."""
    generator = torch.Generator(device=device).manual_seed(0)
    x, residual = (torch.randn(2, 16, 40, generator=generator, device=device).to(dtype) for _ in range(2))
    add = torch.randn(2, 16, generator=generator, device=device).to(dtype)
    bias = torch.randn(16, generator=generator, device=device).to(dtype)
    norm = torch.nn.GroupNorm(4, 16).to(device=device, dtype=dtype)
    mask = torch.ones(2, 1, 40, device=device, dtype=dtype)
    mask[1, :, 25:] = 0
    worst = 0.0
    for extra in ((None, None), (add, residual)):
        got = block_norm(x * 3 + 1, bias, norm, mask, *extra, kernel=True).float()
        want = torch_block_norm(x * 3 + 1, bias, norm, mask, *extra).float()
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
    return worst
