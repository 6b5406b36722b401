"""A decode step's attention that reads each row's own positions only, as one Triton kernel.

The static step's attention in torch (runner_v1.py, runner_qwen.py) reads every row's keys and
values up to the step's length bucket, which the longest row sets: a 1-second row decoding
beside a 30-second one reads thirty seconds of cache at every step. The cache is most of what a
step reads (v1: 56 KiB a position over its 14 layers, 128 rows of 2,000 positions are 14 GiB), so
on text of short and long rows together the step costs what the long rows cost times the rows.

Here, as in flash decoding, one program per (row, head, split of SPLIT positions) walks the
split's positions up to the row's own n (its new token's position) with an online softmax, and a
second kernel merges each row's splits, so a step reads the positions its rows hold and a long
row's are read by several programs at once. v1's relative-position term ((q + v) . p_{n-j}, see
runner_v1.py) is added from the per-layer table, which every row shares (it stays in the GPU's
cache). Grouped-query heads (v2 and v3) read their key head once per query head. Scores and the
softmax are fp32 whatever the cache's format.

Used where Triton runs (a CUDA device with Triton importable; tts.cosyvoice.attention); the torch
path stays the reference, and tests run the kernels in Triton's interpreter on a CPU.
"""

from __future__ import annotations

import functools
import logging
import math
import os

import torch

log = logging.getLogger(__name__)

BLOCK = 64  # positions a program reads at a time
SPLIT = 256  # positions one program covers: a long row's are split among several, then combined

try:  # Triton ships with torch's CUDA builds; a CPU-only install may lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None


def available(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on `device`: a GPU with Triton, or Triton's interpreter (tests)."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _partial_attention(
        Q,
        K,
        V,
        LENGTHS,
        REL,
        BIAS_U,
        BIAS_V,
        BEST,
        TOTAL,
        ACC,
        stride_qb,
        stride_qh,
        stride_kb,
        stride_kh,
        stride_kt,
        stride_vb,
        stride_vh,
        stride_vt,
        stride_rh,
        stride_rt,
        splits,
        scale,
        GROUP: tl.constexpr,
        DIM: tl.constexpr,
        BLOCK_T: tl.constexpr,
        SPLIT_T: tl.constexpr,
        RELATIVE: tl.constexpr,
    ):
        """One (row, head, split): the softmax's running maximum, sum and weighted values over the
        split's positions of the row (none when the split starts past the row's end)."""
        row = tl.program_id(0)
        head = tl.program_id(1)
        split = tl.program_id(2)
        kv_head = head // GROUP
        n = tl.load(LENGTHS + row)  # the new token's position: it attends over 0..n
        d = tl.arange(0, DIM)
        q = tl.load(Q + row * stride_qb + head * stride_qh + d).to(tl.float32)
        q_content = q
        q_position = q
        if RELATIVE:
            q_content = q + tl.load(BIAS_U + head * DIM + d).to(tl.float32)
            q_position = q + tl.load(BIAS_V + head * DIM + d).to(tl.float32)
        best = tl.full((), float("-inf"), tl.float32)
        total = tl.full((), 0.0, tl.float32)
        acc = tl.zeros((DIM,), tl.float32)
        k_base = K + row * stride_kb + kv_head * stride_kh
        v_base = V + row * stride_vb + kv_head * stride_vh
        begin = split * SPLIT_T
        end = tl.minimum(begin + SPLIT_T, n + 1)
        for start in range(begin, end, BLOCK_T):
            t = start + tl.arange(0, BLOCK_T)
            valid = t < end
            keys = tl.load(k_base + t[:, None] * stride_kt + d[None, :], mask=valid[:, None], other=0.0)
            scores = tl.sum(keys.to(tl.float32) * q_content[None, :], axis=1)
            if RELATIVE:
                distance = tl.where(valid, n - t, 0)
                entries = REL + head * stride_rh + distance[:, None] * stride_rt + d[None, :]
                table = tl.load(entries, mask=valid[:, None], other=0.0)
                scores += tl.sum(table.to(tl.float32) * q_position[None, :], axis=1)
            scores = tl.where(valid, scores * scale, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=0))
            keep = tl.exp(best - new_best)
            weights = tl.exp(scores - new_best)
            values = tl.load(v_base + t[:, None] * stride_vt + d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * keep + tl.sum(weights[:, None] * values.to(tl.float32), axis=0)
            total = total * keep + tl.sum(weights, axis=0)
            best = new_best
        at = (row * tl.num_programs(1) + head) * splits + split
        tl.store(BEST + at, best)
        tl.store(TOTAL + at, total)
        tl.store(ACC + at * DIM + d, acc)

    @triton.jit
    def _combine(
        BEST,
        TOTAL,
        ACC,
        LENGTHS,
        OUT,
        stride_ob,
        stride_oh,
        splits,
        DIM: tl.constexpr,
        SPLIT_T: tl.constexpr,
        SPLITS: tl.constexpr,
    ):
        """One (row, head): its splits' partial softmaxes merged into the attention's output."""
        row = tl.program_id(0)
        head = tl.program_id(1)
        n = tl.load(LENGTHS + row)
        s = tl.arange(0, SPLITS)
        used = s <= n // SPLIT_T
        at = (row * tl.num_programs(1) + head) * splits + s
        best = tl.load(BEST + at, mask=used, other=float("-inf"))
        top = tl.max(best, axis=0)
        weights = tl.where(used, tl.exp(best - top), 0.0)
        total = tl.sum(weights * tl.load(TOTAL + at, mask=used, other=0.0), axis=0)
        d = tl.arange(0, DIM)
        acc = tl.load(ACC + at[:, None] * DIM + d[None, :], mask=used[:, None], other=0.0)
        out = tl.sum(weights[:, None] * acc, axis=0) / total
        tl.store(OUT + row * stride_ob + head * stride_oh + d, out.to(OUT.dtype.element_ty))


def decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    length: int,
    scale: float,
    relative: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Each row's new query over its own cache positions 0..lengths[row].

    q [rows, heads, dim]; keys, values [rows, kv heads, capacity, dim] (a layer of the static cache,
    the last dimension contiguous); lengths [rows], each below `length` (the step's bucket: how many
    splits of SPLIT positions a row may need); `relative`: v1's (table [heads, capacity, dim],
    pos_bias_u, pos_bias_v [heads, dim]). Returns the context [rows, heads, dim] in q's format.
    """
    rows, heads, dim = q.shape
    group = heads // keys.shape[1]
    if keys.stride(-1) != 1 or values.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("decode_attention needs the head dimension contiguous")
    table, bias_u, bias_v = relative if relative is not None else (q, q, q)  # unread without RELATIVE
    if relative is not None and table.stride(-1) != 1:
        raise ValueError("decode_attention needs the relative table's head dimension contiguous")
    splits = triton.cdiv(length, SPLIT)
    best = torch.empty((rows, heads, splits), device=q.device, dtype=torch.float32)
    total = torch.empty_like(best)
    acc = torch.empty((rows, heads, splits, dim), device=q.device, dtype=torch.float32)
    _partial_attention[(rows, heads, splits)](
        q,
        keys,
        values,
        lengths,
        table,
        bias_u.contiguous(),
        bias_v.contiguous(),
        best,
        total,
        acc,
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        values.stride(0),
        values.stride(1),
        values.stride(2),
        table.stride(0),
        table.stride(1),
        splits,
        scale,
        GROUP=group,
        DIM=dim,
        BLOCK_T=BLOCK,
        SPLIT_T=SPLIT,
        RELATIVE=relative is not None,
    )
    out = torch.empty_like(q)
    _combine[(rows, heads)](
        best,
        total,
        acc,
        lengths,
        out,
        out.stride(0),
        out.stride(1),
        splits,
        DIM=dim,
        SPLIT_T=SPLIT,
        SPLITS=triton.next_power_of_2(splits),
    )
    return out


def reference(q, keys, values, lengths, length: int, scale: float, relative=None) -> torch.Tensor:
    """The same attention in torch, in fp32, reading every row up to `length` and masking (the runners'
    torch path, written plainly): what the kernel is checked against. The relative table is in the
    kernel's layout, [heads, capacity, dim]."""
    rows, heads, dim = q.shape
    q, keys, values = q.float(), keys[:, :, :length].float(), values[:, :, :length].float()
    group = heads // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    positions = torch.arange(length, device=q.device)
    beyond = positions[None, :] > lengths[:, None]  # [rows, length]
    if relative is None:
        scores = torch.einsum("rhd,rhtd->rht", q, keys)
    else:
        table, bias_u, bias_v = (t.float() for t in relative)
        distance = (lengths[:, None] - positions[None, :]).clamp(0, length - 1)  # [rows, length]
        content = torch.einsum("rhd,rhtd->rht", q + bias_u, keys)
        position = torch.einsum("rhd,hrtd->rht", q + bias_v, table[:, distance])
        scores = content + position
    weights = torch.softmax((scores * scale).masked_fill(beyond[:, None, :], -float("inf")), dim=-1)
    return torch.einsum("rht,rhtd->rhd", weights, values)


@functools.cache
def works(device: str, dim: int, dtype: torch.dtype, group: int = 1, relative: bool = False) -> bool:
    """Whether the kernels compile and agree with `reference` here, on a small case of the runner's kind
    (query heads a key head, v1's relative term) with its head size and format, rows past a split
    included: the compilation is the one the runner's first step needs. A GPU the kernels cannot
    compile for, or compute wrongly on, leaves the step's attention to torch instead of failing every
    batch. Asked once per process for each kind."""

    def measure() -> float:
        generator = torch.Generator(device=device).manual_seed(0)

        def random(*shape):
            return torch.randn(*shape, generator=generator, device=device).to(dtype)

        capacity, length = 2 * SPLIT, SPLIT + BLOCK
        lengths = torch.tensor([0, BLOCK, length - 1], device=device)
        keys, values, q = random(3, 2, capacity, dim), random(3, 2, capacity, dim), random(3, 2 * group, dim)
        table = (random(2, capacity, dim), random(2, dim), random(2, dim)) if relative else None
        got = decode_attention(q, keys, values, lengths, length, 1 / math.sqrt(dim), table)
        want = reference(q, keys, values, lengths, length, 1 / math.sqrt(dim), table)
        return float((got.float() - want).abs().max())

    return kernel_agrees("the decode attention kernel", "the step's attention", dtype, measure)


def kernel_chosen(choice: str, device, setting: str, part: str, check) -> bool:
    """Whether `part` runs its kernel: the setting's `choice` (auto, triton or torch) asks for it or leaves it
    to auto, Triton runs on `device`, and `check()` (the kernel's works) passes. triton where Triton does
    not run says so: the part runs in torch."""
    runs = available(torch.device(device))
    if choice == "triton" and not runs:
        log.warning("%s=triton needs a GPU with Triton: %s runs in torch", setting, part)
    if not runs or choice == "torch" or not check():
        return False
    log.info("%s: the kernel (%s=%s)", part, setting, choice)
    return True


def kernel_agrees(kernel: str, part: str, dtype: torch.dtype, measure) -> bool:
    """Whether a kernel compiles and agrees with its torch path here: `measure()` runs both on a small case and
    gives their largest gap. A compiler or a driver that refuses the kernel, or a gap past the format's
    TOLERANCE, leaves `part` to torch, with a warning, instead of failing every pass."""
    try:
        worst = measure()
    except Exception as exc:  # a compiler or a driver refusing it: the torch path still runs
        log.warning("%s does not run here (%s: %s): %s runs in torch", kernel, type(exc).__name__, exc, part)
        return False
    if not worst <= TOLERANCE[dtype]:
        log.warning("%s is %.3g from torch here: %s runs in torch", kernel, worst, part)
        return False
    return True


# Outputs of fp32 arithmetic over inputs of each format, stored in that format: its rounding and more.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 5e-3}
