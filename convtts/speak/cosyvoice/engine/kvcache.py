"""The decode's key/value caches: static (a fixed row per sequence, preallocated) and padded (upstream's path, grown by
concatenation)."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

CAPACITY_STEP = 128  # a static cache's positions per row are a multiple of this


def round_capacity(positions: int) -> int:
    return -(-max(1, positions) // CAPACITY_STEP) * CAPACITY_STEP


def bytes_per_row(layers: int, width: int, positions: int, dtype: torch.dtype) -> int:
    """A row's keys and values: layers x 2 x (heads x head size) x positions."""
    return layers * 2 * width * positions * torch.empty(0, dtype=dtype).element_size()


class StaticCache:
    """Keys and values preallocated as [layers, rows, heads, capacity, head size]; a sequence keeps its row.

    Each row has its own length (positions filled) and next input token, on the device, so a
    decode step reads and advances them without the CPU. Admitting a row writes its prompt's
    keys into its row; nothing else moves: no concatenation, no re-padding.
    """

    def __init__(self, layers: int, rows: int, heads: int, dim: int, capacity: int, dtype: torch.dtype, device):
        shape = (layers, rows, heads, capacity, dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def fill(self, row: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> int:
        """Write a prompt's per-layer keys and values ([1, heads, positions, dim] each) into `row`."""
        positions = keys[0].shape[2]
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.k[layer, row, :, :positions] = k[0]
            self.v[layer, row, :, :positions] = v[0]
        self.lengths[row] = positions
        return positions

    def fill_rows(self, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> None:
        """Prompts' keys and values ([layers, prompts, heads, width, dim]) into their rows, one copy a side.

        Past a prompt's own length its width holds padding: written, never read (a row attends up to its
        length, and each decode step writes its position before reading it)."""
        width = keys.shape[3]
        self.k[:, :, :, :width].index_copy_(1, rows, keys)
        self.v[:, :, :, :width].index_copy_(1, rows, values)
        self.lengths.index_copy_(0, rows, lengths)

    def write(self, layer: int, rows: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Each of the first `rows` rows gets one new key and value ([rows, heads, dim]) at its position."""
        index = positions.view(rows, 1, 1, 1).expand(rows, k.shape[1], 1, k.shape[2])
        self.k[layer, :rows].scatter_(2, index, k.unsqueeze(2))
        self.v[layer, :rows].scatter_(2, index, v.unsqueeze(2))

    def grown(self, capacity: int) -> StaticCache:
        """A copy with room for `capacity` positions per row (a prompt or a decode bound that did not fit)."""
        layers, rows, heads, _, dim = self.k.shape
        bigger = StaticCache(layers, rows, heads, dim, capacity, self.k.dtype, self.k.device)
        bigger.k[:, :, :, : self.capacity] = self.k
        bigger.v[:, :, :, : self.capacity] = self.v
        bigger.lengths.copy_(self.lengths)
        bigger.tokens.copy_(self.tokens)
        return bigger


class PaddedCache:
    """Upstream's decode path: one cache tensor per layer for the live rows in order, padded on the left.

    A row admitted with a shorter history than the others is padded on the left (its `pad` masks
    them out); a longer one pads the others. Dropping rows cuts the padding they all share.
    """

    def __init__(self):
        self.layers: list[torch.Tensor] = []
        self.order: list = []  # the sequences, in the cache's row order

    def merge(self, seq, layers: list[torch.Tensor]) -> None:
        if not self.order:
            self.layers, self.order = layers, [seq]
            return
        length, new_length = self.layers[0].shape[2], layers[0].shape[2]
        if new_length < length:
            layers = [F.pad(k, (0, 0, length - new_length, 0)) for k in layers]
            seq.pad = length - new_length
        elif new_length > length:
            self.layers = [F.pad(k, (0, 0, new_length - length, 0)) for k in self.layers]
            for other in self.order:
                other.pad += new_length - length
        self.layers = [torch.cat([a, b]) for a, b in zip(self.layers, layers)]
        self.order.append(seq)

    def drop(self, gone: set) -> None:
        """Remove the rows of the sequences in `gone` and the left padding every remaining row shares."""
        keep = [i for i, seq in enumerate(self.order) if seq not in gone]
        if len(keep) == len(self.order):
            return
        self.order = [self.order[i] for i in keep]
        if not self.order:
            self.layers = []
            return
        index = torch.tensor(keep, device=self.layers[0].device)
        shared = min(seq.pad for seq in self.order)
        self.layers = [k.index_select(0, index)[:, :, shared:] for k in self.layers]
        for seq in self.order:
            seq.pad -= shared
