"""v3's DiT between its matrix products: a gated residual, a layer norm and a modulation, as one Triton kernel.

A DiT block does, per frame of 1024 channels, `x + gate * y` (the attention's or the feed-forward's
output added back) and then `norm(x) * (1 + scale) + shift` (the next part's input), with gate,
scale and shift one vector per row. In torch that is a layer norm and two or three elementwise
kernels, each a pass over (rows x frames x 1024) values, and the ones that broadcast a row's vector
over its frames run torch's slow strided path: on an H200 they were as costly as the block's
matrix products. Here one program per frame reads x and y once, writes the new x and the modulated
norm, and keeps the sums in fp32: the arithmetic of the torch path, rounded once at the end where
torch rounds after each step.

Used where Triton runs (attention.available) and the kernel, once a process, compiled and agreed
with the torch path on a small case (`works`); elsewhere, and as the reference in tests, the torch
path below. The kernel runs in Triton's interpreter in the tests.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.attention import available, kernel_agrees, triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _gated_modulate(
        X,
        Y,
        GATE,
        SHIFT,
        SCALE,
        OUT,
        MOD,
        frames,
        dim,
        gates,  # stride between two rows' gates
        vectors,  # and between two rows' shift and scale (views of one (rows, k * dim) tensor)
        eps,
        HAS_Y: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        frame = tl.program_id(0).to(tl.int64)
        row = frame // frames
        cols = tl.arange(0, BLOCK)
        inside = cols < dim
        x = tl.load(X + frame * dim + cols, mask=inside, other=0.0).to(tl.float32)
        if HAS_Y:
            y = tl.load(Y + frame * dim + cols, mask=inside, other=0.0).to(tl.float32)
            gate = tl.load(GATE + row * gates + cols, mask=inside, other=0.0).to(tl.float32)
            x = (x + gate * y).to(OUT.dtype.element_ty)
            tl.store(OUT + frame * dim + cols, x, mask=inside)
            x = x.to(tl.float32)  # the norm reads the new x as stored, as the next block reads it
        mean = tl.sum(x, axis=0) / dim
        centred = tl.where(inside, x - mean, 0.0)
        normed = centred * tl.rsqrt(tl.sum(centred * centred, axis=0) / dim + eps)
        scale = tl.load(SCALE + row * vectors + cols, mask=inside, other=0.0).to(tl.float32)
        shift = tl.load(SHIFT + row * vectors + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(MOD + frame * dim + cols, (normed * (1.0 + scale) + shift).to(MOD.dtype.element_ty), mask=inside)


def gated_modulate(x, added, shift, scale, eps: float, kernel: bool | None = None):
    """(x + gate * y, layer_norm(that) * (1 + scale) + shift) for x (rows, frames, dim) and `added` = (y, gate)
    or None (x as it is); gate, shift and scale are (rows, dim). `kernel` None: Triton where it runs."""
    if kernel is None:
        kernel = fits(x, added, shift, scale)
    if not kernel:
        return torch_gated_modulate(x, added, shift, scale, eps)
    rows, frames, dim = x.shape
    out = torch.empty_like(x) if added is not None else x
    mod = torch.empty_like(x)
    y, gate = added if added is not None else (x, shift)
    _gated_modulate[(rows * frames,)](
        x,
        y,
        gate,
        shift,
        scale,
        out,
        mod,
        frames,
        dim,
        gate.stride(0),
        shift.stride(0),
        eps,
        HAS_Y=added is not None,
        BLOCK=triton.next_power_of_2(dim),
    )
    return out, mod


def torch_gated_modulate(x, added, shift, scale, eps: float):
    """The same in torch (each step rounded to x's dtype, as upstream's DiTBlock)."""
    x = gated_residual(x, added)
    normed = F.layer_norm(x, x.shape[-1:], eps=eps)
    return x, torch.addcmul(shift[:, None], normed, 1 + scale[:, None])


def gated_residual(x, added):
    """x + gate * y for `added` = (y, gate), gate one vector a row; x where `added` is None."""
    if added is None:
        return x
    y, gate = added
    return torch.addcmul(x, gate[:, None], y)


def fits(x, added, shift, scale) -> bool:
    """Whether the kernel takes these tensors: contiguous activations, each vector's channels side by side,
    shift and scale with one row stride."""
    tensors = [x] + ([added[0]] if added is not None else [])
    vectors = [shift, scale] + ([added[1]] if added is not None else [])
    return (
        available(x.device)
        and all(t.is_contiguous() and t.dtype == x.dtype for t in tensors)
        and all(v.stride(1) == 1 for v in vectors)
        and shift.stride() == scale.stride()
        and x.shape[-1] <= 8192
        and works(str(x.device), x.shape[-1], x.dtype)
    )


@functools.cache
def works(device: str, dim: int, dtype: torch.dtype) -> bool:
    """Whether the kernel compiles and agrees with the torch path here, for this width and format (a
    residual and none): a GPU it cannot compile for, or computes wrongly on, leaves the blocks to torch
    instead of failing every pass. Asked once per process for each kind, before any graph capture (a
    process's first flow step runs eagerly)."""

    def measure() -> float:
        generator = torch.Generator(device=device).manual_seed(0)
        x, y = (torch.randn(2, 3, dim, generator=generator, device=device).to(dtype) for _ in range(2))
        shift, scale, gate = torch.randn(2, 3 * dim, generator=generator, device=device).to(dtype).chunk(3, dim=-1)
        pairs = [
            (a, b)
            for added in (None, (y, gate))
            for a, b in zip(
                gated_modulate(x, added, shift, scale, 1e-6, kernel=True),
                torch_gated_modulate(x, added, shift, scale, 1e-6),
            )
        ]
        # of full scale: the modulated values reach 10 or more, where one bf16 step is 0.06
        return max(float((a.float() - b.float()).abs().max() / b.float().abs().max()) for a, b in pairs)

    return kernel_agrees("the modulate kernel", "the block", dtype, measure)
