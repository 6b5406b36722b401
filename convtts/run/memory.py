"""A worker's memory, read without extra packages: resident memory from /proc, GPU memory from its backend."""

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


def gpu_mb(backend, kind: str) -> float:
    """The backend's GPU memory in MiB (`allocated` or `reserved`); 0 for a backend without a GPU."""
    probe = getattr(backend, "gpu_memory_mb", None)
    return probe(kind) if probe else 0.0
