"""How many workers a slot runs: from the cores, and on a GPU from its free memory and a worker's peak."""
from __future__ import annotations

import logging
import os
import subprocess

log = logging.getLogger(__name__)

# The per-worker GPU memory figure comes from workers.gpu_mb_per_worker (default 2600 MiB: one
# CosyVoice-300M worker peaked near 2 GiB on an H200, plus headroom).
MAX_WORKERS_PER_GPU = 16  # past this, MPS gave no more throughput in our sweeps
# Cores left to the slot processes and the system on a GPU node: on a 16-core H200 node, 14 CosyVoice
# workers kept 83% of the cores busy (about 0.95 core each), so 16 would starve them.
GPU_NODE_SPARE_CORES = 2


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def worker_gpu_mb(base: int, per_row: int, rows: int) -> int:
    """A worker's peak GPU memory: the model's, plus each batch row past the first (KV cache, flow)."""
    peak = base + max(0, rows - 1) * per_row
    if rows > 1:
        log.info("a worker of %d rows needs about %d MiB of GPU memory (%d + %d rows x %d)", rows, peak, base, rows - 1, per_row)
    return peak


def choose_workers(requested: int, device: str, slots_on_node: int, gpu_mb_per_worker: int) -> int:
    """The worker count for one slot, with its reasons logged. `requested` > 0 wins."""
    if requested > 0:
        log.info("workers: %d (set by config or --workers)", requested)
        return requested
    slots = max(1, slots_on_node)
    if device == "cpu":
        by_cpu = max(1, cpu_cores() // slots)
        log.info("workers: %d (%d cores shared by %d CPU slots)", by_cpu, cpu_cores(), slots_on_node)
        return by_cpu
    by_cpu = max(1, (cpu_cores() - GPU_NODE_SPARE_CORES) // slots)
    free_mb = free_gpu_mb()
    by_memory = max(1, int(free_mb * 0.9 // gpu_mb_per_worker)) if free_mb else 1
    count = min(by_cpu, by_memory, MAX_WORKERS_PER_GPU)
    log.info(
        "workers: %d = min((cores %d - %d spare) / %d slots = %d, 90%% of %d MiB free / %d MiB per worker = %d, cap %d)",
        count, cpu_cores(), GPU_NODE_SPARE_CORES, slots_on_node, by_cpu, free_mb, gpu_mb_per_worker, by_memory,
        MAX_WORKERS_PER_GPU,
    )
    return count


def free_gpu_mb() -> int:
    """Free memory of the (only) visible GPU, asked of nvidia-smi so this process never touches CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={visible}", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        return int(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        log.warning("could not read free GPU memory from nvidia-smi; assuming room for one worker")
        return 0
