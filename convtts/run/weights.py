"""A slot reads its model's weight files once, into the page cache, so that its workers' mapped loads share them.

Each worker maps the checkpoints its voice lists (Resources.weights; torch.load(mmap=True)): the
pages are the node's page cache, read from disk once and shared by every worker of every slot on
the node. The slot reads the files front to back in a thread while its workers start (imports
and CUDA take seconds), so with a cold cache the disk is read once, in order, rather than in
scattered page faults by several workers at once; with a warm cache it costs a memory copy.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from convtts.counts import plural

log = logging.getLogger(__name__)

CHUNK = 8 << 20


def warm_page_cache(paths: list[Path], rank: int) -> threading.Thread | None:
    """Read `paths` once in a daemon thread; a file that cannot be read is skipped (its worker will say why)."""
    if not paths:
        return None
    thread = threading.Thread(target=_read_all, args=(paths, rank), name="warm-weights", daemon=True)
    thread.start()
    return thread


def _read_all(paths: list[Path], rank: int) -> None:
    started, total = time.time(), 0
    buffer = bytearray(CHUNK)
    for path in paths:
        try:
            with open(path, "rb", buffering=0) as fh:
                while count := fh.readinto(buffer):
                    total += count
        except OSError as exc:
            log.warning("slot %d: could not read %s ahead of the workers: %s", rank, path, exc)
    log.info(
        "slot %d: read %.2f GB of model weights (%s) into the page cache in %.1f s",
        rank,
        total / 1e9,
        plural(len(paths), "file"),
        time.time() - started,
    )
