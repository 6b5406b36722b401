"""HiFT's Snake activation, `x + sin(alpha x)^2 / alpha` with one alpha a channel, as one Triton kernel.

Upstream's Snake is five elementwise kernels over (rows x channels x samples), each a pass over the
vocoder's widest activations (bf16 rounding after each): in a batched vocoder pass on an H200 these
kernels took about two thirds of its GPU time, its convolutions the rest. The engine's vocoder
copy (vocoder.Vocoder's twin) has each Snake's forward replaced by `snake`, which reads x once and
writes once, in fp32; upstream's own HiFT, which serves a pass of one row, is left as it is. In a
ResBlock (hift.resblock) the convolution before each Snake, and before each residual, leaves its
bias to the same kernel, which masks the row's padding too (`conv_then`).

Used where Triton runs and the kernel, once a process, compiled and agreed with upstream's
arithmetic on a small case (`works`); elsewhere, and as the reference in tests, `torch_snake`.
"""

from __future__ import annotations

import functools

import torch

from convtts.speak.cosyvoice.engine.attention import available, kernel_agrees, triton

NO_DIV_BY_ZERO = 1e-9  # upstream's Snake.no_div_by_zero

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _snake(
        X,
        ALPHA,
        BIAS,
        MASK,
        RESIDUAL,
        OUT,
        size,
        channels,
        samples,
        masks,  # stride between two rows' masks
        eps,
        SNAKE: tl.constexpr,
        LOG_SCALE: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = at < size
        channel = (at // samples) % channels
        x = tl.load(X + at, mask=inside, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(BIAS + channel, mask=inside, other=0.0).to(tl.float32)
        if HAS_MASK:
            x *= tl.load(MASK + (at // (samples * channels)) * masks + at % samples, mask=inside, other=0.0).to(
                tl.float32
            )
        if SNAKE:
            alpha = tl.load(ALPHA + channel, mask=inside, other=1.0).to(tl.float32)
            if LOG_SCALE:
                alpha = tl.exp(alpha)
            wave = tl.sin(x * alpha)
            x = x + wave * wave / (alpha + eps)
        if HAS_RESIDUAL:
            x += tl.load(RESIDUAL + at, mask=inside, other=0.0).to(tl.float32)
        tl.store(OUT + at, x.to(OUT.dtype.element_ty), mask=inside)


def snake(module, x: torch.Tensor, kernel: bool | None = None) -> torch.Tensor:
    """Snake.forward of `module` (its alpha, alpha_logscale) on x (rows, channels, samples)."""
    if kernel is None:
        kernel = fits(module, x)
    if not kernel:
        return torch_snake(module, x)
    return launch(x, module=module)


def conv_then(conv, x: torch.Tensor, mask: torch.Tensor, act=None, residual=None) -> torch.Tensor:
    """`act(conv(x) * mask) + residual` (act a Snake or None, residual None or like the output): the
    convolution without its bias, then the bias, the mask, the Snake and the residual in one kernel
    where it runs (a plain Conv1d, the mask (rows, 1, samples))."""
    if not (type(conv) is torch.nn.Conv1d and conv.bias is not None and takes(conv, x, mask, act, residual)):
        y = conv(x) * mask
        y = y if act is None else act(y)
        return y if residual is None else y + residual
    return launch(conv._conv_forward(x, conv.weight, None), act, conv.bias, mask, residual)


def takes(conv, x, mask, act, residual) -> bool:
    """Whether conv_then's kernel takes these (the convolution's output is contiguous, as cuDNN gives it)."""
    return (
        x.dim() == 3
        and (act is None or (type(act).__name__ == "Snake" and alphas_fit(act, x)))
        and mask.dim() == 3
        and mask.shape[1] == 1
        and mask.stride(2) == 1
        and (residual is None or (residual.is_contiguous() and residual.dtype == x.dtype))
        and conv.bias.is_contiguous()
        and ready(x)
    )


def launch(x, module=None, bias=None, mask=None, residual=None) -> torch.Tensor:
    out = torch.empty_like(x)
    size, block = x.numel(), 1024
    _snake[(triton.cdiv(size, block),)](
        x,
        module.alpha if module is not None else x,
        bias if bias is not None else x,
        mask if mask is not None else x,
        residual if residual is not None else x,
        out,
        size,
        x.shape[1],
        x.shape[2],
        mask.stride(0) if mask is not None else 0,
        module.no_div_by_zero if module is not None else 0.0,
        SNAKE=module is not None,
        LOG_SCALE=bool(module is not None and module.alpha_logscale),
        HAS_BIAS=bias is not None,
        HAS_MASK=mask is not None,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
    )
    return out


def torch_snake(module, x: torch.Tensor) -> torch.Tensor:
    """Upstream's arithmetic (cosyvoice.transformer.activation.Snake.forward)."""
    alpha = module.alpha[None, :, None]
    if module.alpha_logscale:
        alpha = torch.exp(alpha)
    return x + (1.0 / (alpha + module.no_div_by_zero)) * torch.sin(x * alpha).pow(2)


def fits(module, x: torch.Tensor) -> bool:
    """Whether the kernel takes a Snake's x: contiguous (rows, channels, samples), one alpha a channel."""
    return x.dim() == 3 and x.is_contiguous() and alphas_fit(module, x) and ready(x)


def alphas_fit(module, x: torch.Tensor) -> bool:
    return module.alpha.is_contiguous() and module.alpha.shape == (x.shape[1],)


def ready(x: torch.Tensor) -> bool:
    """Triton runs for x's device, and the kernel passed its check there in x's format."""
    return available(x.device) and works(str(x.device), x.dtype)


def fuse(hift: torch.nn.Module) -> int:
    """Each Snake of `hift` (the engine's own copy) runs `snake` from now on; how many there are."""
    snakes = [m for m in hift.modules() if type(m).__name__ == "Snake"]
    for module in snakes:
        module.forward = functools.partial(snake, module)
    return len(snakes)


class Probe(torch.nn.Module):
    """A Snake of upstream's attributes, for works' check."""

    def __init__(self, alpha: torch.Tensor, log_scale: bool):
        super().__init__()
        self.alpha, self.alpha_logscale, self.no_div_by_zero = alpha, log_scale, NO_DIV_BY_ZERO


@functools.cache
def works(device: str, dtype: torch.dtype) -> bool:
    """Whether the kernel compiles and agrees with torch_snake here in this format, alphas on both scales,
    alone and after a convolution's bias and mask with a residual (conv_then): a GPU it cannot compile for,
    or computes wrongly on, leaves HiFT's Snakes to torch instead of failing every pass. Asked once per
    process, on its first batched vocoder pass."""

    def measure() -> float:
        generator = torch.Generator(device=device).manual_seed(0)
        x, residual = ((torch.randn(2, 8, 300, generator=generator, device=device) * 3).to(dtype) for _ in range(2))
        alpha, bias = ((torch.rand(8, generator=generator, device=device) + 0.2).to(dtype) for _ in range(2))
        mask = torch.ones(2, 1, 300, device=device, dtype=dtype)
        mask[1, :, 170:] = 0
        worst = 0.0
        for module in (Probe(alpha, False), Probe(alpha.log(), True)):
            # upstream's arithmetic in fp32 on the same values: the kernel rounds once, at its output
            exact = Probe(module.alpha.float(), module.alpha_logscale)
            pairs = [
                (snake(module, x, kernel=True), torch_snake(exact, x.float())),
                (
                    launch(x, module, bias, mask, residual),
                    torch_snake(exact, (x.float() + bias.float()[:, None]) * mask.float()) + residual.float(),
                ),
            ]
            worst = max([worst] + [float((a.float() - b).abs().max() / b.abs().max()) for a, b in pairs])
        return worst

    return kernel_agrees("HiFT's Snake kernel", "HiFT's Snakes", dtype, measure)
