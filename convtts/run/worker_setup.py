"""What a worker process sets up with the OS and the GPU driver: dying with its slot, how its CPU waits
for the GPU (workers.cuda_sync), and a model's memory handed back before the next one loads."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal

log = logging.getLogger(__name__)


def release_backend(backend) -> None:
    """Close a backend and hand its memory back before the next model loads.

    glibc keeps freed heap pages: with a full-size CosyVoice model on CPU, RSS between models
    stayed at 3227 MiB without malloc_trim and fell to about 1050 MiB with it, and the peak over
    five rebuilds settled at 3787 MiB against 3470 (bench/rebuild_memory.py).
    """
    backend.close()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


CUDA_SYNC_FLAGS = {"spin": 1, "yield": 2, "block": 4}  # the driver's CU_CTX_SCHED_* flags


def set_cuda_sync(mode: str) -> bool:
    """Tell the NVIDIA driver how this process waits for its GPU (workers.cuda_sync), before its
    first CUDA call: the flags of the device's primary context, which torch then uses. True if set;
    False for auto, or where there is no driver (a CPU machine) or no visible GPU."""
    if mode == "auto":
        return False
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    device = ctypes.c_int()
    if driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return False
    set_flags = getattr(driver, "cuDevicePrimaryCtxSetFlags_v2", None) or driver.cuDevicePrimaryCtxSetFlags
    code = set_flags(device, CUDA_SYNC_FLAGS[mode])
    if code != 0:
        log.warning("workers.cuda_sync=%s: the driver refused it (CUresult %d); keeping its own choice", mode, code)
        return False
    log.info(
        "workers.cuda_sync=%s: this worker's CPU %s while it waits for the GPU",
        mode,
        {"spin": "spins", "yield": "yields", "block": "sleeps"}[mode],
    )
    return True


def die_with_parent(parent_pid: int, start_method: str = "spawn") -> None:
    """Ask Linux to kill this worker if its parent dies, so no orphan keeps writing a shard.

    The parent is the slot, or under forkserver the slot's server, which exits with the slot.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == parent_pid or (start_method == "forkserver" and alive(parent_pid)):
        return
    os._exit(1)  # the slot died before the request above took effect


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process now has the number
        return False
    return True
