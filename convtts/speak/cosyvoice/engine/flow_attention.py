"""A flow pass's self-attention over each row's own frames, as one Triton kernel.

The flow estimators' attention (the U-Nets' transformer blocks, v3's DiT blocks) runs over a padded
pass: rows of different lengths, each padded up to the pass's width, their padding masked by a key
bias. torch's attention with a mask reads every key of the width for every row and takes the mask
as one more tensor; on an H200 it was a third of a v1 flow pass's GPU time (16 rows of 3 s),
for problems as small as 32 x 8 heads of 129 frames.

Here, as in flash attention's forward, one program per (block of BLOCK queries, row, head) walks the
row's keys up to its own length, a block at a time, with an online softmax: a short row of a pass
reads only its own frames, and no mask is read. Frames past a row's end come out zero (upstream's
DiT zeroes them too; the U-Net masks them before every convolution, and no valid frame attends to
them). Scores and the softmax are fp32; the products run on the tensor cores in the input's format
(IEEE fp32 for fp32 inputs).

The rows' masks are padding masks: a row's frames first, its padding after (what a flow pass is).
Used where Triton runs, tts.cosyvoice.flow.attention asks for it (auto, the default, or triton) and
the kernel, once a process, compiled and agreed with torch on a small case (`works`); the torch
attention stays the reference, and tests run the kernel in Triton's interpreter on a CPU.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine.attention import available, kernel_agrees, triton

BLOCK = 64  # queries a program holds, and keys it reads at a time
LOG2E = 1.4426950408889634

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _flow_attention(
        Q,
        K,
        V,
        LENGTHS,
        OUT,
        stride_qb,
        stride_qh,
        stride_qt,
        stride_kb,
        stride_kh,
        stride_kt,
        stride_vb,
        stride_vh,
        stride_vt,
        stride_ob,
        stride_ot,
        heads,
        frames,
        scale,
        DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        EXACT: tl.constexpr,
    ):
        """One (block of queries, row, head): softmax(q k^T * scale) v over the row's first n keys; zero for
        queries at or past n."""
        block = tl.program_id(0)
        row = tl.program_id(1) // heads
        head = tl.program_id(1) % heads
        n = tl.load(LENGTHS + row)
        m = block * BLOCK_T + tl.arange(0, BLOCK_T)
        d = tl.arange(0, DIM)
        q_at = Q + row * stride_qb + head * stride_qh + m[:, None] * stride_qt + d[None, :]
        q = tl.load(q_at, mask=m[:, None] < n, other=0.0)  # queries past the row's end: zeros, not what memory holds
        k_base = K + row * stride_kb + head * stride_kh
        v_base = V + row * stride_vb + head * stride_vh
        best = tl.full((BLOCK_T,), float("-inf"), tl.float32)
        total = tl.zeros((BLOCK_T,), tl.float32)
        acc = tl.zeros((BLOCK_T, DIM), tl.float32)
        end = tl.where(block * BLOCK_T < n, n, 0)  # a block of queries all past the row's end reads nothing
        for start in range(0, end, BLOCK_T):
            t = start + tl.arange(0, BLOCK_T)
            valid = t < n
            keys = tl.load(k_base + t[:, None] * stride_kt + d[None, :], mask=valid[:, None], other=0.0)
            if EXACT:
                scores = tl.dot(q, tl.trans(keys), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(keys))
            scores = tl.where(valid[None, :], scores * scale, float("-inf"))  # scale holds log2(e): exp2 below
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            keep = tl.exp2(best - new_best)
            weights = tl.exp2(scores - new_best[:, None])
            values = tl.load(v_base + t[:, None] * stride_vt + d[None, :], mask=valid[:, None], other=0.0)
            if EXACT:
                acc = acc * keep[:, None] + tl.dot(weights, values, input_precision="ieee")
            else:
                acc = acc * keep[:, None] + tl.dot(weights.to(values.dtype), values)
            total = total * keep + tl.sum(weights, axis=1)
            best = new_best
        inside = (m < n) & (total > 0.0)
        out = tl.where(inside[:, None], acc / tl.where(inside, total, 1.0)[:, None], 0.0)
        at = OUT + row * stride_ob + m[:, None] * stride_ot + head * DIM + d[None, :]
        tl.store(at, out.to(OUT.dtype.element_ty), mask=m[:, None] < frames)


def frame_counts(mask: torch.Tensor) -> torch.Tensor:
    """Each row's frames (int32) from its padding mask (rows, 1, frames), nonzero on them."""
    return (mask[:, 0] != 0).sum(dim=-1, dtype=torch.int32)


def flow_attention(query, key, value, lengths, kernel: bool | None = None) -> torch.Tensor:
    """Self-attention of (rows, heads, frames, dim) views over each row's first `lengths` keys, laid out as
    (rows, frames, heads x dim) for the output projection; zero past a row's end. `kernel` None: Triton
    where it runs."""
    if kernel is None:
        kernel = fits(query, key, value)
    if not kernel:
        return torch_flow_attention(query, key, value, lengths)
    rows, heads, frames, dim = query.shape
    out = torch.empty(rows, frames, heads * dim, device=query.device, dtype=query.dtype)
    _flow_attention[(triton.cdiv(frames, BLOCK), rows * heads)](
        query,
        key,
        value,
        lengths,
        out,
        *query.stride()[:3],
        *key.stride()[:3],
        *value.stride()[:3],
        out.stride(0),
        out.stride(1),
        heads,
        frames,
        LOG2E / math.sqrt(dim),
        DIM=dim,
        BLOCK_T=BLOCK,
        EXACT=query.dtype == torch.float32,
        num_warps=4,
    )
    return out


def torch_flow_attention(query, key, value, lengths) -> torch.Tensor:
    """The same in torch: the keys past each row's end masked, the frames past it zeroed."""
    rows, heads, frames, dim = query.shape
    inside = torch.arange(frames, device=query.device)[None, :] < lengths[:, None]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=inside[:, None, None, :])
    return out.transpose(1, 2).reshape(rows, frames, heads * dim).masked_fill(~inside[:, :, None], 0.0)


def fits(query, key, value) -> bool:
    """Whether the kernel takes these: one format, each frame's head width side by side, a head width the
    tensor cores take."""
    dim = query.shape[-1]
    return (
        available(query.device)
        and query.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and all(t.dtype == query.dtype and t.shape == query.shape and t.stride(-1) == 1 for t in (key, value))
        and query.stride(-1) == 1
        and dim in (16, 32, 64, 128)
        and works(str(query.device), dim, query.dtype)
    )


@functools.cache
def works(device: str, dim: int, dtype: torch.dtype) -> bool:
    """Whether the kernel compiles and agrees with torch_flow_attention here for this head width and format
    (rows ending inside a block, on a block's edge, and of one frame): a GPU it cannot compile for, or
    computes wrongly on, leaves the flow's attention to torch instead of failing every pass. Asked once
    per process for each kind, before any graph capture (a process's first flow step runs eagerly)."""
    return kernel_agrees(
        "the flow attention kernel", "the flow's attention", dtype, functools.partial(gap, device, dim, dtype)
    )


@torch.inference_mode()
def gap(device: str, dim: int, dtype: torch.dtype) -> float:
    """works' measure: the kernel against torch_flow_attention on a small case, the largest gap of full scale."""
    generator = torch.Generator(device=device).manual_seed(0)
    frames = BLOCK + 37
    qkv = torch.randn(4, frames, 3, 2, dim, generator=generator, device=device).to(dtype)
    query, key, value = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # views, as a joined product gives them
    lengths = torch.tensor([frames, BLOCK, 50, 1], device=device, dtype=torch.int32)
    got = flow_attention(query, key, value, lengths, kernel=True).float()
    want = torch_flow_attention(query, key, value, lengths).float()
    return float((got - want).abs().max() / want.abs().max())
