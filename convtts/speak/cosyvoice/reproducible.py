"""What makes a CosyVoice worker's output repeatable and its model comparable: every generator
upstream draws from seeded by the utterance's seed, and an exact digest of the weights that the
workers of a slot must share. Apart from backend.py, which calls them: the seeds before each
utterance, the digest when a worker is asked for its weights.
"""

from __future__ import annotations

import random

import numpy as np


def seed_everything(seed: int) -> None:
    """Seed every generator upstream draws from; each model load resets them to 1986."""
    import torch

    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch.manual_seed(seed)  # the CPU generator and, lazily, every CUDA device
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def weights_checksum(tensors) -> str:
    """16 hex digits over tensors, each summed as the integers its bits spell: exact, so the same
    values give the same digest whatever their device, layout or alignment (float sums differ in
    the last bit with the order of the additions)."""
    import hashlib

    import torch

    widths = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
    with torch.no_grad():
        sums = [
            t.detach().contiguous().reshape(-1).view(widths[t.element_size()]).sum(dtype=torch.int64)
            for t in tensors
            if t.numel()
        ]
        total = torch.stack(sums).cpu() if sums else torch.zeros(0, dtype=torch.int64)
    return hashlib.blake2b(total.numpy().tobytes(), digest_size=8).hexdigest()
