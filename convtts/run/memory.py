"""A worker's memory, read without extra packages: resident memory from /proc; the cap on its GPU's."""

from __future__ import annotations

import os
from pathlib import Path


def rss_mb() -> float:
    """Resident memory of this process in MiB, from /proc (no extra package)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def cap_gpu_memory(mb: int) -> float | None:
    """Hold this process's CUDA allocations to `mb` MiB of its GPU (workers.gpu_mb_cap): past it torch
    raises an out-of-memory, which a worker recovers from as from any other. Returns the share of the
    GPU set, or None where there is nothing to cap (0, or no GPU)."""
    if mb <= 0:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    share = min(1.0, mb * 2**20 / total)
    torch.cuda.set_per_process_memory_fraction(share, 0)
    return share
