"""Runs the DiT's gated-modulate kernel (engine/modulate.py) in Triton's interpreter against its torch path.

TRITON_INTERPRET must be set before Triton is imported, so this runs in a process of its own:

    TRITON_INTERPRET=1 python tests/interpreted_modulate.py
    TRITON_INTERPRET=1 python tests/interpreted_modulate.py dit COSYVOICE_CHECKOUT

Rows of a width that is not a power of two, with and without a residual, gate, shift and scale as
views of one (rows, 6 x width) tensor as the blocks make them, in fp32 and bf16; `dit`: a padded
pass of a small DiT through the kernel against upstream's DiT.forward of each row alone. Prints
"ok" when everything agrees.
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
    refused(x, shift, scale)


def refused(x, shift, scale) -> None:
    """A kernel that will not compile leaves the DiT to the torch path, with a warning, not an error."""
    from convtts.speak.cosyvoice.engine import modulate

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("no compiler for this device")

            return launch

    kernel, modulate._gated_modulate = modulate._gated_modulate, Broken()
    modulate.works.cache_clear()
    try:
        assert not modulate.fits(x, None, shift, scale)
        out = modulate.gated_modulate(x, None, shift, scale, 1e-6)
        assert torch.equal(out[1], modulate.torch_gated_modulate(x, None, shift, scale, 1e-6)[1])
    finally:
        modulate._gated_modulate = kernel
        modulate.works.cache_clear()


def dit(checkout: str) -> None:
    from convtts.config import CosyVoiceConfig
    from convtts.speak.cosyvoice.runtime import import_runtime

    import_runtime(CosyVoiceConfig(runtime_root=checkout))
    from cosyvoice.flow.DiT.dit import DiT

    from convtts.speak.cosyvoice.engine.estimator import padded_forward
    from convtts.testing.flow_vocoder import each_alone

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
        padded = padded_forward(est)(x, mask, mu, t, spks, cond)
        for i, (n, alone) in enumerate(zip(frames, each_alone(est, frames, x, mask, mu, t, spks, cond))):
            gap = float((padded[i, :, :n] - alone).abs().max() / alone.abs().max())
            assert gap <= 1e-5, (i, gap)


def main() -> int:
    numpy_scalars()
    if sys.argv[1:2] == ["dit"]:
        dit(sys.argv[2])
    else:
        kernel()
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
