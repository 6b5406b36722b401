"""Runs the flow estimators' kernels (engine/modulate.py, engine/groupnorm.py) in Triton's interpreter against
their torch paths.

TRITON_INTERPRET must be set before Triton is imported, so this runs in a process of its own:

    TRITON_INTERPRET=1 python tests/interpreted_modulate.py
    TRITON_INTERPRET=1 python tests/interpreted_modulate.py dit COSYVOICE_CHECKOUT
    TRITON_INTERPRET=1 python tests/interpreted_modulate.py blocknorm
    TRITON_INTERPRET=1 python tests/interpreted_modulate.py framenorm
    TRITON_INTERPRET=1 python tests/interpreted_modulate.py unet
    TRITON_INTERPRET=1 python tests/interpreted_modulate.py snake
    TRITON_INTERPRET=1 python tests/interpreted_modulate.py flowattention

The gated-modulate kernel: rows of a width that is not a power of two, with and without a residual,
gate, shift and scale as views of one (rows, 6 x width) tensor as the DiT's blocks make them, in fp32
and bf16; `dit`: a padded pass of a small DiT through it against upstream's DiT.forward of each row
alone. `blocknorm`: the U-Net's block kernel with and without its added vector and residual, rows
ending inside the pass, values past Mish's threshold. `framenorm`: v2's causal block kernel against
upstream's CausalBlock1D (with and without the added vector and the residual, a width that is not a
power of two). `unet`: padded passes of small v1 and v2 U-Nets
through both kernels (the engine's copy with q, k and v joined, and upstream's modules) against
each row alone. `snake`: HiFT's Snake kernel against upstream's Snake (alphas on both scales), and a
ResBlock as the vocoder's copy runs it (its Snakes and its convolutions' biases, masks and residuals
in the kernel) against upstream's block. `flowattention`: the flow's attention kernel over each row's own
frames against each row's attention alone (the U-Net and DiT passes above run it too). A kernel that
will not compile leaves its part to torch. Prints "ok" when everything agrees.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from interpreted_attention import numpy_scalars


def kernel() -> None:
    from convtts.speak.cosyvoice.engine.modulate import fits, gated_modulate, torch_gated_modulate

    torch.manual_seed(0)
    rows, frames, dim = 3, 5, 96
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        x, y = (torch.randn(rows, frames, dim).to(dtype) for _ in range(2))
        x = x * 3 + 1  # a mean and a spread of their own
        shift, scale, gate = torch.randn(rows, 6 * dim).to(dtype).chunk(6, dim=-1)[:3]
        for added in (None, (y, gate)):
            assert fits(x, added, shift, scale), "the kernel should take these"
            ours = gated_modulate(x, added, shift, scale, 1e-6, kernel=True)
            theirs = torch_gated_modulate(x, added, shift, scale, 1e-6)
            for a, b in zip(ours, theirs):
                gap = float((a.float() - b.float()).abs().max() / b.float().abs().max())
                assert a.dtype == dtype and a.shape == b.shape and gap <= tolerance, (dtype, added is None, gap)
            if added is None:
                assert ours[0] is x  # no residual: x comes back as it was
    assert not fits(x.transpose(0, 1), None, shift, scale)  # not contiguous: the torch path
    from convtts.speak.cosyvoice.engine import modulate

    refused(
        modulate,
        "_gated_modulate",
        lambda: modulate.fits(x, None, shift, scale),
        lambda: modulate.gated_modulate(x, None, shift, scale, 1e-6)[1],
        lambda: modulate.torch_gated_modulate(x, None, shift, scale, 1e-6)[1],
    )


class Counted:
    """A kernel that counts its launches, so that a pass that fell back to torch is not taken for the kernel's."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def refused(module, name: str, fits, run, reference) -> None:
    """A kernel (module.name) that will not compile leaves its part to the torch path, with a warning, not an
    error: `fits` says no, and `run` gives what `reference` does."""

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("no compiler for this device")

            return launch

    kernel = getattr(module, name)
    setattr(module, name, Broken())
    module.works.cache_clear()
    try:
        assert not fits()
        assert torch.equal(run(), reference())
    finally:
        setattr(module, name, kernel)
        module.works.cache_clear()


def block_norm() -> None:
    import copy

    from convtts.speak.cosyvoice.engine import groupnorm

    torch.manual_seed(0)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        x = (torch.randn(3, 12, 50) * 3 + 1).to(dtype)
        residual = torch.randn(3, 12, 50).to(dtype)
        add = torch.randn(3, 24)[:, :12].to(dtype)  # a view, as the time embedding's projection comes
        bias = (torch.randn(12) * 30).to(dtype)  # some channels past Mish's threshold (20)
        norm = torch.nn.GroupNorm(3, 12).to(dtype)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        mask = torch.ones(3, 1, 50).to(dtype)
        mask[1, :, 31:] = 0
        mask[2, :, 7:] = 0
        exact = copy.deepcopy(norm).float()
        with torch.inference_mode():
            for extra in ((None, None), (add, None), (None, residual), (add, residual)):
                assert groupnorm.fits(x, bias, norm, mask, *extra), "the kernel should take these"
                ours = groupnorm.block_norm(x, bias, norm, mask, *extra, kernel=True)
                # the torch path in fp32 on the same values: the kernel rounds once, at its output
                wide = [None if v is None else v.float() for v in extra]
                theirs = groupnorm.torch_block_norm(x.float(), bias.float(), exact, mask.float(), *wide)
                gap = float((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max())
                assert ours.dtype == dtype and gap <= tolerance, (dtype, extra[0] is None, extra[1] is None, gap)
    refused(
        groupnorm,
        "_block_norm",
        lambda: groupnorm.fits(x, bias, norm, mask),
        lambda: groupnorm.block_norm(x, bias, norm, mask),
        lambda: groupnorm.torch_block_norm(x, bias, norm, mask),
    )


def frame_norm() -> None:
    """v2's causal block kernel against upstream's CausalBlock1D as its resnet block calls it, in fp32 and bf16."""
    import copy

    from cosyvoice.flow.decoder import CausalBlock1D

    from convtts.speak.cosyvoice.engine import framenorm

    torch.manual_seed(0)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        block = CausalBlock1D(12, 40).eval()  # 40 channels: not a power of two
        with torch.no_grad():
            for p in block.parameters():
                p.add_(torch.randn_like(p) * 0.3)
            block.block[0].bias.mul_(60)  # some channels past Mish's threshold (20) after the norm's shift
            block.block[2].bias.mul_(30)
        exact, block = block, copy.deepcopy(block).to(dtype)
        parts = framenorm.causal_parts(block)
        x = (torch.randn(3, 12, 50) * 3 + 1).to(dtype)
        add, residual = torch.randn(3, 80)[:, :40].to(dtype), torch.randn(3, 40, 50).to(dtype)
        mask = torch.ones(3, 1, 50).to(dtype)
        mask[1, :, 31:] = 0
        mask[2, :, 7:] = 0
        assert parts is not None and framenorm.fits(parts, x, mask), "the kernel should take this block"
        with torch.inference_mode():
            for extra in ((None, None), (add, None), (None, residual), (add, residual)):
                ours = framenorm.frame_block(parts, x * mask, mask, *extra)
                # upstream's block in fp32 on the same values, then the resnet's add, mask and residual
                theirs = exact(x.float(), mask.float())
                if extra[0] is not None:
                    theirs = (theirs + extra[0].float()[:, :, None]) * mask.float()
                if extra[1] is not None:
                    theirs = theirs + extra[1].float()
                gap = float((ours.float() - theirs).abs().max() / theirs.abs().max())
                assert ours.dtype == dtype and gap <= tolerance, (dtype, extra[0] is None, extra[1] is None, gap)
    assert framenorm.causal_parts(torch.nn.Sequential()) is None
    refused(
        framenorm,
        "_frame_norm",
        lambda: framenorm.fits(parts, x, mask),
        lambda: framenorm.frame_block(parts, x * mask, mask) if framenorm.fits(parts, x, mask) else block(x, mask),
        lambda: block(x, mask),
    )


def snakes() -> None:
    import copy

    from cosyvoice.hifigan.generator import ResBlock
    from cosyvoice.transformer.activation import Snake

    from convtts.speak.cosyvoice.engine import snake
    from convtts.speak.cosyvoice.engine.hift import resblock
    from convtts.speak.cosyvoice.engine.precision import cast_copy

    torch.manual_seed(0)
    with torch.inference_mode():
        for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
            for log_scale in (False, True):
                module = Snake(12, alpha_logscale=log_scale)
                module.alpha.copy_(torch.rand(12) + 0.2 if not log_scale else torch.randn(12) * 0.5)
                exact = copy.deepcopy(module)  # upstream's forward in fp32 on the same values
                module.to(dtype)
                exact.alpha.copy_(module.alpha.float())
                x = (torch.randn(3, 12, 70) * 3).to(dtype)
                assert snake.fits(module, x), "the kernel should take these"
                ours, theirs = snake.snake(module, x, kernel=True), exact(x.float())
                gap = float((ours.float() - theirs).abs().max() / theirs.abs().max())
                assert ours.dtype == dtype and gap <= tolerance, (dtype, log_scale, gap)
        block = ResBlock(16, 3, [1, 3, 5]).eval()
        h = torch.randn(2, 16, 90)
        mask = torch.ones(2, 1, 90)
        mask[1, :, 61:] = 0
        for p in block.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        want = resblock(block, h, mask)
        block = cast_copy(block, "fp32", fold=True)  # as the vocoder's copy: weight norms folded, plain Conv1d
        assert snake.fuse(block) == 6
        kernel = snake._snake
        snake._snake = Counted(kernel)
        try:
            got = resblock(block, h, mask)
            launches = snake._snake.launches
        finally:
            snake._snake = kernel
        # each dilation: the first Snake alone, the second with the convolution's bias and mask before it,
        # then the second convolution's bias, mask and residual
        assert launches == 9 and float((got - want).abs().max() / want.abs().max()) <= 1e-5
    refused(
        snake,
        "_snake",
        lambda: snake.fits(module, x),
        lambda: snake.snake(module, x),
        lambda: snake.torch_snake(module, x),
    )


def flow_attention_kernel() -> None:
    """Rows ending inside a block, on a block's edge and after one frame, NaN in every padded frame (of q, k
    and v): each row's frames within rounding of its attention alone, zeros past its end. fp32 and fp16:
    the interpreter's products do not round bf16 as a GPU does (works() checks bf16 there)."""
    from convtts.speak.cosyvoice.engine import flow_attention as fa

    torch.manual_seed(0)
    rows, frames, heads, dim = 4, 150, 2, 32
    lengths = torch.tensor([150, 64, 97, 1], dtype=torch.int32)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        qkv = torch.randn(rows, frames, 3 * heads * dim)
        for i, n in enumerate(lengths.tolist()):
            qkv[i, n:] = float("nan")
        qkv = qkv.to(dtype)
        # views of one product, as estimator.attention makes them
        query, key, value = (y.view(rows, frames, heads, dim).transpose(1, 2) for y in qkv.split(heads * dim, -1))
        assert fa.fits(query, key, value), "the kernel should take these"
        got = fa.flow_attention(query, key, value, lengths, kernel=True)
        assert got.shape == (rows, frames, heads * dim) and got.dtype == dtype
        for i, n in enumerate(lengths.tolist()):
            own = (y[i : i + 1, :, :n].float() for y in (query, key, value))
            alone = torch.nn.functional.scaled_dot_product_attention(*own).transpose(1, 2).reshape(n, -1)
            gap = float((got[i, :n].float() - alone).abs().max() / alone.abs().max())
            assert gap <= tolerance, (dtype, i, gap)
            assert torch.equal(got[i, n:], torch.zeros_like(got[i, n:])), (dtype, i)
    query, key, value = torch.randn(3, rows, heads, frames, dim).unbind()  # torch's attention reads the padding
    refused(
        fa,
        "_flow_attention",
        lambda: fa.fits(query, key, value),
        lambda: fa.flow_attention(query, key, value, lengths),
        lambda: fa.torch_flow_attention(query, key, value, lengths),
    )


def unet() -> None:
    """Small U-Nets of both kinds through both kernels: padded, each row within float rounding of its pass alone."""
    import copy

    from cosyvoice.flow.decoder import CausalConditionalDecoder, ConditionalDecoder

    from convtts.speak.cosyvoice.engine import flow_attention, framenorm, groupnorm, modulate
    from convtts.speak.cosyvoice.engine.estimator import padded_forward, unet_blocks
    from convtts.testing.flow_vocoder import each_alone

    # the kernels agree with torch here (their checks launch them too, before the counts start)
    assert groupnorm.works("cpu", torch.float32) and modulate.works("cpu", 32, torch.float32)
    assert flow_attention.works("cpu", 16, torch.float32) and framenorm.works("cpu", torch.float32)
    modulate._gated_modulate = Counted(modulate._gated_modulate)
    groupnorm._block_norm = Counted(groupnorm._block_norm)
    framenorm._frame_norm = Counted(framenorm._frame_norm)
    flow_attention._flow_attention = Counted(flow_attention._flow_attention)

    torch.manual_seed(0)
    lengths, width = [37, 50, 23], 56
    for cls in (ConditionalDecoder, CausalConditionalDecoder):
        shape = dict(channels=(32, 32), attention_head_dim=16, n_blocks=1, num_mid_blocks=2, num_heads=2)
        est = cls(in_channels=320, out_channels=80, dropout=0.0, act_fn="gelu", **shape).eval()
        with torch.no_grad():
            for p in est.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        assert unet_blocks(est, owned=False) is not None, "its transformer blocks should be re-driven"
        x, mu, cond = (torch.randn(3, 80, width) for _ in range(3))
        spks, t = torch.randn(3, 80), torch.rand(3)
        mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float().unsqueeze(1)
        with torch.inference_mode():
            alone = each_alone(est, lengths, x, mask, mu, t, spks, cond)
            for owned, kernel in ((False, False), (True, False), (True, True)):
                forward = padded_forward(copy.deepcopy(est), owned=owned, kernel=kernel)
                padded = forward(x, mask, mu, t, spks, cond)
                for i, (n, row) in enumerate(zip(lengths, alone)):
                    gap = float((padded[i, :, :n] - row).abs().max() / row.abs().max())
                    assert gap <= 1e-5, (cls.__name__, owned, kernel, i, gap)
        # every resnet's two blocks and the final block (v1's group norms, v2's layer norms each in its kernel)
        # and every transformer block's two norms, each pass: at both resolutions (the halved one's mask is a copy
        # of its own); the attention of every transformer block in the pass with the flow's attention kernel
        levels = [*est.down_blocks, *est.mid_blocks, *est.up_blocks]
        blocks = sum(len(level[1]) for level in levels)
        v1 = cls is ConditionalDecoder
        assert groupnorm._block_norm.launches == (3 * (2 * len(levels) + 1) if v1 else 0)
        assert framenorm._frame_norm.launches == (0 if v1 else 3 * (2 * len(levels) + 1))
        assert modulate._gated_modulate.launches == 3 * 2 * blocks
        assert flow_attention._flow_attention.launches == blocks
        for counted in (modulate._gated_modulate, groupnorm._block_norm, framenorm._frame_norm):
            counted.launches = 0
        flow_attention._flow_attention.launches = 0


def dit(checkout: str) -> None:
    from convtts.config import CosyVoiceConfig
    from convtts.speak.cosyvoice.runtime import import_runtime

    import_runtime(CosyVoiceConfig(runtime_root=checkout))
    from cosyvoice.flow.DiT.dit import DiT

    from convtts.speak.cosyvoice.engine import flow_attention
    from convtts.speak.cosyvoice.engine.estimator import padded_forward
    from convtts.testing.flow_vocoder import each_alone

    assert flow_attention.works("cpu", 16, torch.float32)
    flow_attention._flow_attention = Counted(flow_attention._flow_attention)
    torch.manual_seed(0)
    shape = dict(dim=64, depth=2, heads=4, dim_head=16, ff_mult=2, mel_dim=80, mu_dim=80, spk_dim=80, out_channels=80)
    est = DiT(**shape, static_chunk_size=50, num_decoding_left_chunks=-1).eval()
    for p in est.parameters():
        torch.nn.init.normal_(p, std=0.05)
    frames = [48, 40, 16]
    x, mu, cond = (torch.randn(3, 80, 48) for _ in range(3))
    spks, t = torch.randn(3, 80), torch.rand(3)
    mask = torch.zeros(3, 1, 48)
    for i, n in enumerate(frames):
        mask[i, :, :n] = 1
    with torch.inference_mode():
        alone = each_alone(est, frames, x, mask, mu, t, spks, cond)
        for kernel in (False, True):
            padded = padded_forward(est, kernel=kernel)(x, mask, mu, t, spks, cond)
            for i, (n, row) in enumerate(zip(frames, alone)):
                gap = float((padded[i, :, :n] - row).abs().max() / row.abs().max())
                assert gap <= 1e-5, (kernel, i, gap)
    assert flow_attention._flow_attention.launches == shape["depth"]  # each block's, with the kernel only


def main() -> int:
    numpy_scalars()
    if sys.argv[1:2] == ["dit"]:
        dit(sys.argv[2])
    elif sys.argv[1:2] == ["blocknorm"]:
        block_norm()
    elif sys.argv[1:2] == ["framenorm"]:
        frame_norm()
    elif sys.argv[1:2] == ["unet"]:
        unet()
    elif sys.argv[1:2] == ["snake"]:
        snakes()
    elif sys.argv[1:2] == ["flowattention"]:
        flow_attention_kernel()
    else:
        kernel()
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
