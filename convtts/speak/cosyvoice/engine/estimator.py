"""The flow estimators re-driven for padded batches: a row's frames never see another row's or the padding.

Upstream's estimators (v1's ConditionalDecoder, v2's CausalConditionalDecoder, v3's DiT) are
called here module by module, with three changes that keep a padded row equal to its solo
rendering and the memory small:

- v1's Block1D normalises over groups of channels and *all* frames, padding included (up to 2% of
  full scale from solo in a padded pass); here its statistics are taken over the row's own frames
  (groupnorm.py), which is what the row alone computes. v2's and v3's norms are per frame.
- The attention masks are one key mask per row (B, 1, T) broadcast over queries and heads;
  upstream repeats them to (B, T, T) per block, and diffusers again per head, which at 2 x 32 rows
  of 800 frames is 1.3 GB for each of v1's 18 transformer blocks.
- Inputs arrive in fp32 and are cast to the estimator's own dtype (a bf16/fp16 copy, see
  precision.py); the timestep embedding is computed in fp32 before the cast, the output is fp32.

The blocks are re-driven too, for the GPU's memory traffic rather than for the padding: a step is
as much elementwise work over (rows x frames x channels) as matrix products. v3's DiT blocks
(dit_blocks) and the U-Nets' transformer blocks (unet_transformer) take each residual with the next
norm in one kernel (modulate.py) and q, k and v in one product; v1's resnet blocks run each
convolution's bias, group norm, Mish, time embedding, mask and residual in one (groupnorm.py), v2's
causal blocks the same with their layer norm over each frame (framenorm.py). With
tts.cosyvoice.flow.attention, the re-driven blocks' attention reads each row's own frames only
(flow_attention.py), where torch's reads the pass's whole width with the padding masked.

Everything else (convolutions, which see zeros past a row's end as in the solo pass; the
feed-forwards) is upstream's own modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from convtts.speak.cosyvoice.engine import flow_attention, framenorm
from convtts.speak.cosyvoice.engine.framenorm import causal_parts, frame_block
from convtts.speak.cosyvoice.engine.groupnorm import block_norm
from convtts.speak.cosyvoice.engine.modulate import fits, gated_modulate, gated_residual

MASKED = -1.0e10  # upstream's attention bias for a masked key (mask_to_bias)


def padded_forward(estimator, owned: bool = False, kernel: bool = False) -> Callable | None:
    """estimate(x, mask, mu, t, spks, cond) for a padded batch, or None for an estimator we do not know.
    `owned`: the estimator is the engine's own copy (bf16/fp16), whose parameters may be laid out anew.
    `kernel`: the re-driven blocks' attention reads each row's own frames (flow_attention.py) where it runs."""
    kind = type(estimator).__name__
    if kind in ("ConditionalDecoder", "CausalConditionalDecoder"):
        return partial(unet, estimator, unet_blocks(estimator, owned), kernel)
    if kind == "DiT":
        projections = [joined_qkv(block.attn) if owned else None for block in estimator.transformer_blocks]
        return partial(dit, estimator, projections, kernel)
    return None


def first_attention(estimator):
    """The estimator's first self-attention module (diffusers' Attention in the U-Nets, the DiT's own), or None."""
    if type(estimator).__name__ == "DiT":
        return estimator.transformer_blocks[0].attn
    blocks = getattr(estimator, "down_blocks", None)
    return blocks[0][1][0].attn1 if blocks else None


def key_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, T) additive attention bias: 0 for a row's frames, very negative for its padding."""
    bias = (1.0 - mask.float()) * MASKED
    if dtype == torch.float16:  # -1e10 overflows fp16 to -inf, and 0 * -inf is NaN
        bias = bias.clamp(min=torch.finfo(torch.float16).min)
    return bias.to(dtype)


def group_norm_block(block) -> tuple | None:
    """(conv, norm) of v1's Block1D (a Conv1d with a bias, a GroupNorm, Mish), or None (v2's CausalBlock1D)."""
    parts = list(block.block)
    if len(parts) == 3 and type(parts[0]) is torch.nn.Conv1d and parts[0].bias is not None:
        if isinstance(parts[1], torch.nn.GroupNorm) and isinstance(parts[2], torch.nn.Mish):
            return parts[0], parts[1]
    return None


def conv_norm(parts, x, mask, add=None, residual=None):
    """A Block1D's (conv, norm) on x, already masked: the convolution without its bias, then block_norm (the
    bias, the norm over each row's own frames, Mish, `add`, the mask, `residual`)."""
    conv, norm = parts
    return block_norm(conv._conv_forward(x, conv.weight, None), conv.bias, norm, mask, add, residual)


def block_1d(block, x, mask):
    """Block1D (conv, norm, Mish) or CausalBlock1D (conv, LayerNorm, Mish), masked as upstream's forward; v1's
    group norm over each row's own frames, from the convolution on in one kernel where it runs (conv_norm);
    v2's from the convolution on in one kernel where it runs (framenorm.frame_block)."""
    parts = group_norm_block(block)
    if parts is not None:
        return conv_norm(parts, x * mask, mask)
    causal = causal_parts(block)
    return frame_block(causal, x * mask, mask) if framenorm.fits(causal, x, mask) else block(x, mask)


def resnet_1d(resnet, x, mask, temb):
    """ResnetBlock1D / CausalResnetBlock1D. v1's blocks run from their convolutions through block_norm, v2's
    through framenorm's frame_block (the bias, the norm, Mish, the time embedding, the mask and the
    residual: one kernel where it runs); elsewhere v2's blocks are upstream's."""
    first, second = group_norm_block(resnet.block1), group_norm_block(resnet.block2)
    if first is None or second is None:
        first, second = causal_parts(resnet.block1), causal_parts(resnet.block2)
        if framenorm.fits(first, x, mask) and framenorm.fits(second, x, mask):
            masked = x * mask
            h = frame_block(first, masked, mask, add=resnet.mlp(temb))  # zero past each row's end, as v1's
            return frame_block(second, h, mask, residual=resnet.res_conv(masked))
        h = block_1d(resnet.block1, x, mask)
        h = h + resnet.mlp(temb).unsqueeze(-1)
        h = block_1d(resnet.block2, h, mask)
        return h + resnet.res_conv(x * mask)
    masked = x * mask
    h = conv_norm(first, masked, mask, add=resnet.mlp(temb))  # zero past each row's end: the next conv takes it so
    return conv_norm(second, h, mask, residual=resnet.res_conv(masked))


@dataclass(frozen=True)
class Redriven:
    """What unet_transformer needs of a BasicTransformerBlock: q, k and v as one product (None: three), and
    each layer norm as gated_modulate's (shift, scale, gate) for every row (norm_vectors)."""

    qkv: tuple | None
    norm1: tuple
    norm3: tuple


def unet_blocks(est, owned: bool) -> dict | None:
    """Each transformer block of the U-Net, Redriven; None (upstream's blocks) where one is not the plain
    block unet_transformer re-drives."""
    blocks = [block for level in (*est.down_blocks, *est.mid_blocks, *est.up_blocks) for block in level[1]]
    if not all(plain_block(block) for block in blocks):
        return None
    return {
        block: Redriven(
            joined_qkv(block.attn1) if owned else None, norm_vectors(block.norm1), norm_vectors(block.norm3)
        )
        for block in blocks
    }


def plain_block(block) -> bool:
    """A BasicTransformerBlock with layer norms of their own weights, self-attention alone, and the
    attention processor's default steps (no further norm, residual or output scale)."""
    attn = getattr(block, "attn1", None)
    norms = [getattr(block, "norm1", None), getattr(block, "norm3", None)]
    return (
        type(block).__name__ == "BasicTransformerBlock"
        and all(isinstance(n, torch.nn.LayerNorm) and n.weight is not None and n.bias is not None for n in norms)
        and getattr(block, "attn2", None) is None
        and getattr(block, "_chunk_size", None) is None
        and not getattr(block, "only_cross_attention", False)
        and type(getattr(attn, "processor", None)).__name__ == "AttnProcessor2_0"
        and all(getattr(attn, name, None) is None for name in ("spatial_norm", "group_norm", "norm_q", "norm_k"))
        and not getattr(attn, "residual_connection", True)
        and getattr(attn, "rescale_output_factor", None) == 1.0
    )


def norm_vectors(norm: torch.nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(shift, scale, gate) for gated_modulate: the norm's bias, its weight less one in fp32 (one plus that
    is the weight exactly), ones."""
    weight = norm.weight.detach()
    return norm.bias.detach(), weight.float() - 1, torch.ones_like(weight)


def residual_norm(x, y, norm, vectors):
    """(x + y, norm(x + y)); y None: (x, norm(x)). One gated_modulate kernel where it runs."""
    shift, scale, gate = (v.expand(x.shape[0], -1) for v in vectors)
    added = None if y is None else (y, gate)
    if fits(x, added, shift, scale):
        return gated_modulate(x, added, shift, scale, norm.eps, kernel=True)
    x = x if y is None else x + y
    return x, norm(x)


def unet_transformer(blocks, prepared, x, bias, counts=None):
    """A level's BasicTransformerBlocks over x (rows, frames, channels), returned channels first. Re-driven
    (prepared): each residual taken with the next norm (residual_norm), the key mask broadcast over the
    heads (upstream repeats it for each), or each row's own frames read alone where `counts` (frame_counts)
    are given, q, k and v one product where the engine owns the weights, and the last residual added as
    the output is laid out channels first."""
    if prepared is None:
        for block in blocks:
            x = block(hidden_states=x, attention_mask=bias)
        return x.transpose(1, 2).contiguous()
    keys, added = bias[:, :, None, :], None
    for block in blocks:
        redriven = prepared[block]
        x, normed = residual_norm(x, added, block.norm1, redriven.norm1)
        attended = attention(block.attn1, redriven.qkv, normed, keys, counts=counts)
        x, normed = residual_norm(x, attended, block.norm3, redriven.norm3)
        added = block.ff(normed)
    out = torch.empty(x.shape[0], x.shape[2], x.shape[1], device=x.device, dtype=x.dtype)
    if added is None:
        return out.copy_(x.transpose(1, 2))
    return torch.add(x.transpose(1, 2), added.transpose(1, 2), out=out)


def level(resnet, blocks, prepared, x, mask, bias, temb, counts=None):
    """A resnet then transformer blocks at one resolution of the U-Net."""
    x = resnet_1d(resnet, x, mask, temb)
    return unet_transformer(blocks, prepared, x.transpose(1, 2).contiguous(), bias, counts)


def unet(est, prepared, kernel, x, mask, mu, t, spks, cond):
    """ConditionalDecoder.forward (v1) / CausalConditionalDecoder.forward (v2, not streaming), padding-safe."""
    dtype = est.final_proj.weight.dtype
    temb = est.time_mlp(est.time_embeddings(t.float()).to(dtype))
    h = torch.cat([x, mu, spks[:, :, None].expand(-1, -1, x.shape[2]), cond], dim=1).to(dtype)
    masks = [mask.to(dtype)]
    for _ in est.down_blocks[1:]:  # every down block but the last halves the frames
        masks.append(masks[-1][:, :, ::2].contiguous())  # the block-norm kernel reads a row's mask side by side
    biases = [key_bias(m, dtype) for m in masks]
    counts = [flow_attention.frame_counts(m) if kernel and prepared else None for m in masks]
    hiddens = []
    for i, (resnet, blocks, down) in enumerate(est.down_blocks):
        h = level(resnet, blocks, prepared, h, masks[i], biases[i], temb, counts[i])
        hiddens.append(h)
        h = down(h * masks[i])
    for resnet, blocks in est.mid_blocks:
        h = level(resnet, blocks, prepared, h, masks[-1], biases[-1], temb, counts[-1])
    for i, (resnet, blocks, up) in zip(reversed(range(len(masks))), est.up_blocks):
        skip = hiddens.pop()
        h = torch.cat([h[:, :, : skip.shape[-1]], skip], dim=1)
        h = level(resnet, blocks, prepared, h, masks[i], biases[i], temb, counts[i])
        h = up(h * masks[i])
    h = block_1d(est.final_block, h, masks[0])
    return (est.final_proj(h * masks[0]) * masks[0]).float()


def dit(est, projections, kernel, x, mask, mu, t, spks, cond):
    """DiT.forward (v3, not streaming), with the key mask as (B, 1, 1, T) instead of (B, 1, T, T) and
    the blocks as dit_blocks runs them."""
    dtype = est.proj_out.weight.dtype
    embed = est.time_embed
    temb = embed.time_mlp(embed.time_embed(t.float()).to(dtype))
    h = est.input_embed(
        x.transpose(1, 2).to(dtype), cond.transpose(1, 2).to(dtype), mu.transpose(1, 2).to(dtype), spks.to(dtype)
    ).contiguous()  # it comes frames-last from the position convolution: every pass over it would be strided
    freqs, scale = est.rotary_embed.forward_from_seq_len(h.shape[1])
    residual = h
    keys = mask.bool()[:, :, None, :]  # the attention processor takes mask[:, 0, -1] as the rows' frames
    if isinstance(scale, torch.Tensor):  # xpos rotary scales: upstream's blocks
        for block in est.transformer_blocks:
            h = block(h, temb, mask=keys, rope=(freqs, scale))
        added = None
    else:
        turn = (freqs.cos(), freqs.sin())  # upstream computes them again in every block, q and k alike
        counts = flow_attention.frame_counts(mask) if kernel else None
        h, added = dit_blocks(est, projections, h, temb, keys, turn, counts)
    if added is not None and est.long_skip_connection is None:
        # the last block's residual with the final norm (scale before shift in its linear)
        scale_out, shift_out = est.norm_out.linear(F.silu(temb)).chunk(2, dim=-1)
        _, h = gated_modulate(h, added, shift_out, scale_out, est.norm_out.norm.eps)
    else:
        h = gated_residual(h, added)
        if est.long_skip_connection is not None:
            h = est.long_skip_connection(torch.cat((h, residual), dim=-1))
        h = est.norm_out(h, temb)
    return est.proj_out(h).transpose(1, 2).float()


def dit_blocks(est, projections, x, temb, keys, turn, counts=None):
    """DiTBlock.forward for every block, with fewer passes over the (rows, frames, dim) activations:
    each gated residual (x + gate * y), layer norm and modulation (norm * (1 + scale) + shift) is
    one gated_modulate, the feed-forward's residual taken with the next block's norm; the rotary
    embedding is written over q's and k's first head width in place, where upstream rebuilds both
    whole in fp32 and casts them back; q, k and v are one product where the engine owns the weights;
    the attention output's zeroing of padded frames is left out (nothing valid reads those frames:
    keys are masked, every other layer is per frame). Returns x before the last block's feed-forward
    residual, and that residual (y, gate)."""
    added = None
    for block, qkv in zip(est.transformer_blocks, projections):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.attn_norm.linear(F.silu(temb)).chunk(
            6, dim=-1
        )
        x, normed = gated_modulate(x, added, shift_msa, scale_msa, block.attn_norm.norm.eps)
        attended = attention(block.attn, qkv, normed, keys, turn, counts)
        x, normed = gated_modulate(x, (attended, gate_msa), shift_mlp, scale_mlp, block.ff_norm.eps)
        added = (block.ff(normed), gate_mlp)
    return x, added


def attention(attn, qkv, x, keys, turn=None, counts=None):
    """The attention processor's steps (not joint): q, k and v (one product where `qkv` is given), the rotary
    embedding applied in place where `turn` is, the keys masked by `keys` (a bias or booleans broadcast
    over the heads and queries), the output projection. With `counts` (each row's frames) and where the
    kernel runs, each row's own keys only (flow_attention.py; the frames past a row's end come out zero)."""
    batch, frames, _ = x.shape
    inner = attn.to_q.weight.shape[0]
    if qkv is not None:
        query, key, value = F.linear(x, *qkv).split(inner, dim=-1)
    else:
        query, key, value = attn.to_q(x), attn.to_k(x), attn.to_v(x)
    if turn is not None:
        rotate(query, turn)
        rotate(key, turn)
    query, key, value = (y.view(batch, frames, attn.heads, -1).transpose(1, 2) for y in (query, key, value))
    if counts is not None:
        return attn.to_out[0](flow_attention.flow_attention(query, key, value, counts))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=keys)
    return attn.to_out[0](out.transpose(1, 2).reshape(batch, frames, inner))


def rotate(y: torch.Tensor, turn) -> None:
    """x_transformers' apply_rotary_pos_emb (no xpos scale) on y's first rotary width, in place: the
    same arithmetic (fp32 with the fp32 angles, cast back), the rest of y untouched, as upstream's cast
    round trip leaves it."""
    from x_transformers.x_transformers import rotate_half

    cos, sin = turn
    head = y[..., : cos.shape[-1]]
    head.copy_(head * cos + rotate_half(head) * sin)


def joined_qkv(attn) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """attn's to_q, to_k and to_v as one weight and bias (None where none has one), their parameters made
    views of them (no second copy); None where they cannot be (some with a bias, others without; other widths)."""
    linears = (attn.to_q, attn.to_k, attn.to_v)
    biased = {lin.bias is not None for lin in linears}
    if len(biased) != 1 or len({lin.weight.shape for lin in linears}) != 1:
        return None
    joined = []
    for name in ("weight", "bias") if biased.pop() else ("weight",):
        whole = torch.cat([getattr(lin, name).detach() for lin in linears])
        for lin, part in zip(linears, whole.chunk(3)):
            getattr(lin, name).data = part
        joined.append(whole)
    return joined[0], joined[1] if len(joined) > 1 else None
