"""v2/v3 prompts prefilled by our own forward of the Qwen2 backbone, one CUDA graph per bucket.

Through the Hugging Face modules a prefill launches about a thousand kernels (24 layers of norms,
rotary positions, projections, attention and MLP) however many prompts it holds: on an H200 a
prompt of 160 positions takes 17 ms alone, nearly all of it launches, and the worker's decode waits
for it. Prompts padded on the right under a causal mask need no padding mask (a position sees only
earlier ones, all of its own prompt), so one forward over (rows, width) serves any prompts up to
that width; captured once per bucket, it replays as one launch. It writes every layer's keys and
values into static buffers, from which they go into the cache's rows in one copy a side.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from convtts.cuda_graphs import StepGraphs
from convtts.speak.cosyvoice.engine.runner import PREFILL_ROWS, on_device

ROWS = (1, 2, 4, 8, PREFILL_ROWS)  # row buckets (a group holds at most PREFILL_ROWS prompts)
WIDTH_STEP = 32  # width buckets: a prompt pads at most this many positions
MAX_WIDTH = 512  # wider prompts go through the Hugging Face modules


def width_bucket(width: int) -> int:
    return -(-width // WIDTH_STEP) * WIDTH_STEP


class QwenPrefill:
    """Prompts' embeddings in, their last hidden states and every layer's keys and values out.

    `run(embedded)` takes each prompt's embeddings ([positions, width] each) and returns the
    bucket's width; then `last[:n]` holds each one's last hidden state and `keys` / `values`
    ([layers, rows, key heads, positions, head size]) their keys and values, up to the bucket's
    width (past a prompt's own length they are padding, never read: a row attends to its length).
    """

    def __init__(self, runner, graphs: bool):
        self.runner = runner
        backbone = runner.backbone
        layers, groups, dim = runner.shape
        hidden = backbone.config.hidden_size
        device, dtype = runner.device, runner.dtype
        rows = ROWS[-1]
        self.inputs = torch.zeros(rows, MAX_WIDTH, hidden, dtype=dtype, device=device)
        self.lengths = torch.ones(rows, dtype=torch.long, device=device)
        self.keys = torch.zeros(layers, rows, groups, MAX_WIDTH, dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.last = torch.zeros(rows, hidden, dtype=dtype, device=device)
        self.cos, self.sin = runner.rotary_tables(MAX_WIDTH)
        self.graphs = StepGraphs(self.forward, device, graphs, False, [], "the prefill")

    def takes(self, widths: list[int]) -> bool:
        return len(widths) <= ROWS[-1] and max(widths) <= MAX_WIDTH

    def run(self, embedded: list[torch.Tensor]) -> int:
        """The prompts through the backbone; the width of the bucket their keys fill."""
        count = len(embedded)
        rows = next(n for n in ROWS if n >= count)
        width = width_bucket(max(len(e) for e in embedded))
        for i, e in enumerate(embedded):
            self.inputs[i, : len(e)] = e
        # the bucket's padding rows read position 0: a length left from a wider group would index past the width
        self.lengths[:rows] = on_device([len(e) for e in embedded] + [1] * (rows - count), self.lengths.device)
        self.graphs.run(rows, width)
        return width

    def forward(self, rows: int, width: int) -> None:
        """The captured prefill of the first `rows` prompts over `width` positions, into the static buffers."""
        runner = self.runner
        heads, (_, groups, dim) = runner.heads, runner.shape
        x = self.inputs[:rows, :width]
        cos, sin = self.cos[:width], self.sin[:width]
        for i, layer in enumerate(runner.layers):
            attention = layer.self_attn
            q, k, v = F.linear(layer.input_layernorm(x), *runner.qkv[i]).split(
                [heads * dim, groups * dim, groups * dim], dim=-1
            )
            q = rotate(q.view(rows, width, heads, dim).transpose(1, 2), cos, sin)
            k = rotate(k.view(rows, width, groups, dim).transpose(1, 2), cos, sin)
            v = v.view(rows, width, groups, dim).transpose(1, 2)
            self.keys[i, :rows, :, :width] = k
            self.values[i, :rows, :, :width] = v
            share = heads // groups  # the query heads each key head serves, as the backbone repeats them
            context = F.scaled_dot_product_attention(
                q,
                k.repeat_interleave(share, dim=1),
                v.repeat_interleave(share, dim=1),
                is_causal=True,
                scale=attention.scaling,
            )
            x = x + attention.o_proj(context.transpose(1, 2).reshape(rows, width, heads * dim))
            gate, up = F.linear(layer.post_attention_layernorm(x), runner.gate_up[i]).chunk(2, dim=-1)
            x = x + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
        ends = self.lengths[:rows] - 1
        self.last[:rows] = runner.backbone.norm(x[torch.arange(rows, device=x.device), ends])

    def clear(self) -> None:
        self.graphs.clear()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions, Hugging Face's convention (the two halves of each head rotated together)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
