"""How many workers a slot runs: from the cores, and on a GPU from its free memory and a worker's peak."""

from __future__ import annotations

import logging
import os
import subprocess

from convtts.counts import plural

log = logging.getLogger(__name__)

# The per-worker GPU memory figure comes from workers.gpu_mb_per_worker (default 2600 MiB: one
# CosyVoice-300M worker peaked near 2 GiB on an H200, plus headroom).
MAX_WORKERS_PER_GPU = 16  # past this, MPS gave no more throughput in our sweeps
# Cores left to the slot processes and the system on a GPU node: on a 16-core H200 node, 14 CosyVoice
# workers kept 83% of the cores busy (about 0.95 core each), so 16 would starve them.
GPU_NODE_SPARE_CORES = 2
# The share of a GPU's free memory a slot plans its workers in; the rest is left for the CUDA contexts and
# the allocator's slack.
FREE_SHARE = 0.9


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def worker_gpu_mb(base: int, per_row: int, rows: int) -> int:
    """A worker's peak GPU memory: the model's, plus each batch row past the first (KV cache, flow)."""
    peak = base + max(0, rows - 1) * per_row
    if rows > 1:
        log.info(
            "a worker of %d rows needs about %d MiB of GPU memory (%d + %d rows x %d)",
            rows,
            peak,
            base,
            rows - 1,
            per_row,
        )
    return peak


def gpu_slot_cores(slots_on_node: int) -> int:
    """Cores one GPU slot's workers may use: the node's, less the spare ones, shared by its slots."""
    return max(1, (cpu_cores() - GPU_NODE_SPARE_CORES) // max(1, slots_on_node))


def choose_workers(requested: int, device: str, slots_on_node: int, gpu_mb_per_worker: int) -> int:
    """The worker count for one slot, with its reasons logged. `requested` > 0 wins."""
    if requested > 0:
        log.info("workers: %d (set by config or --workers)", requested)
        return requested
    slots = max(1, slots_on_node)
    if device == "cpu":
        by_cpu = max(1, cpu_cores() // slots)
        log.info("workers: %d (%s shared by %s)", by_cpu, plural(cpu_cores(), "core"), plural(slots, "CPU slot"))
        return by_cpu
    by_cpu = gpu_slot_cores(slots)
    free_mb = free_gpu_mb()
    by_memory = max(1, int(free_mb * FREE_SHARE // gpu_mb_per_worker)) if free_mb else 1
    count = min(by_cpu, by_memory, MAX_WORKERS_PER_GPU)
    log.info(
        "workers: %d = min((cores %d - %d spare) / %d slots = %d, %.0f%% of %d MiB free / %d MiB per worker = %d, cap "
        "%d)",
        count,
        cpu_cores(),
        GPU_NODE_SPARE_CORES,
        slots_on_node,
        by_cpu,
        FREE_SHARE * 100,
        free_mb,
        gpu_mb_per_worker,
        by_memory,
        MAX_WORKERS_PER_GPU,
    )
    return count


def free_gpu_mb() -> int:
    """Free memory of the (only) visible GPU, asked of nvidia-smi so this process never touches CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={visible}", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return int(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        log.warning("could not read free GPU memory from nvidia-smi; assuming room for one worker")
        return 0


# A batched worker of fixed rows peaks at its model, its rows' decode state (the static KV cache)
# and the working memory of one flow or vocoder pass, which its pass budget caps
# (tts.cosyvoice.flow.max_mb). On an H100, 8 workers of 64 rows at 30 words with the 4096 MiB
# default each peaked at 9.7-11.7 GiB, 82 GB together: workers ran out of memory mid-run, lost
# the utterances they had in flight and went on at half their rows. A slot shrinks the pass
# budget until its workers fit, down to PASS_MIN_MB, before it runs fewer workers.
PASS_MIN_MB = 1024


def pass_room(budget: float, workers: int, base: int, rows: int, row_mb: float) -> float:
    """MiB a flow or vocoder pass may take when `workers` of `rows` rows share `budget` MiB."""
    return budget / workers - (base + rows * row_mb)


def fit_passes(
    requested: int,
    slots_on_node: int,
    base: int,
    rows: int,
    row_mb: float,
    pass_mb: int,
    rows_per_gpu: int = 0,
    free_mb: int | None = None,
) -> tuple[int, int]:
    """(workers, MiB a flow or vocoder pass may take) for batched GPU workers of `rows` fixed rows.

    As many workers as the cores allow, at most `rows_per_gpu` rows together (0: no bound) and
    MAX_WORKERS_PER_GPU (`requested` > 0 wins), each peaking at base + rows x row_mb + its pass
    budget within FREE_SHARE of the GPU's free memory (`free_mb`; None: asked of nvidia-smi); the budget
    is at most `pass_mb` and shrinks to PASS_MIN_MB before a worker is dropped.
    """
    by_cpu = gpu_slot_cores(slots_on_node)
    budget = (free_gpu_mb() if free_mb is None else free_mb) * FREE_SHARE
    by_rows = max(1, rows_per_gpu // max(1, rows)) if rows_per_gpu else MAX_WORKERS_PER_GPU
    workers = requested or min(by_cpu, by_rows, MAX_WORKERS_PER_GPU)
    if budget <= 0:
        return (requested or 1), pass_mb  # nvidia-smi could not say: one worker, as choose_workers does
    fixed = base + rows * row_mb
    while not requested and workers > 1 and pass_room(budget, workers, base, rows, row_mb) < PASS_MIN_MB:
        workers -= 1
    room = int(pass_room(budget, workers, base, rows, row_mb))
    passes = max(64, min(pass_mb, room))
    log.info(
        "workers: %d (%s), each %.0f MiB (model %d + %d rows x %.0f) and passes of %d MiB "
        "(at most %d; %.0f%% of %.0f MiB free over %d workers leaves %d)",
        workers,
        "set by config or --workers"
        if requested
        else f"min(cores {by_cpu}, {rows_per_gpu or 'any'} rows a GPU / {rows} = {by_rows}, "
        f"cap {MAX_WORKERS_PER_GPU}), fewer if passes fell under {PASS_MIN_MB} MiB",
        fixed,
        base,
        rows,
        row_mb,
        passes,
        pass_mb,
        FREE_SHARE * 100,
        budget / FREE_SHARE,
        workers,
        room,
    )
    if room < 64:
        log.warning(
            "%s of %d rows do not fit this GPU's free memory: expect out-of-memory retries",
            plural(workers, "worker"),
            rows,
        )
    return workers, passes


def rows_with_room(
    workers: int, base: int, rows: int, roomy: int, row_mb: float, pass_mb: int, fitted_mb: int, free_mb: int
) -> tuple[int, int]:
    """(rows, pass MiB) for `workers` fitted at `rows` with passes of `fitted_mb`: `roomy` rows each,
    with passes of at most `pass_mb`, where FREE_SHARE of the free memory leaves those passes PASS_MIN_MB;
    else `rows` and `fitted_mb` as they were.

    On an H200, 8 workers of 128 rows ran the steady state 7-11% above 8 of 96 (passes shrunk to
    1,888 MiB); on an H100, whose memory holds 5 of 96, 4 of 128 were no faster at 1,000
    conversations and 4% slower at 300 (docs/PERFORMANCE.md). So rows grow only where the workers
    the slot counted at its rows all hold more, never at the price of a worker.
    """
    if roomy <= rows or free_mb <= 0:
        return rows, fitted_mb
    room = int(pass_room(free_mb * FREE_SHARE, workers, base, roomy, row_mb))
    if room < PASS_MIN_MB:
        log.info(
            "rows: %d (%s of %d rows would leave passes of %d MiB, under %d)",
            rows,
            plural(workers, "worker"),
            roomy,
            room,
            PASS_MIN_MB,
        )
        return rows, fitted_mb
    passes = min(pass_mb, room)
    log.info(
        "rows: %d in place of %d (tts.cosyvoice.batch_size_with_room): %s of %d rows fit with passes of %d MiB",
        roomy,
        rows,
        plural(workers, "worker"),
        roomy,
        passes,
    )
    return roomy, passes


# Automatic rows (tts.cosyvoice.batch_size: 0). On an H200, 8 batched workers under MPS measured best
# and 64 rows beat 32 (docs/PERFORMANCE.md); a worker gets fewer rows only when its share of the
# GPU memory cannot hold them, and a slot runs fewer workers before any gets under MIN_AUTO_ROWS.
BATCHED_WORKERS_PER_GPU = 8
AUTO_ROWS = 64
MIN_AUTO_ROWS = 16
CPU_ROWS = 8  # a CPU worker's rows: more only make each step longer on a core


def choose_layout(
    requested: int, device: str, slots_on_node: int, gpu_mb_per_worker: int, gpu_mb_per_row: float
) -> tuple[int, int]:
    """(workers, rows per worker) when rows are automatic, with the reasons logged. `requested` workers > 0 win."""
    if device == "cpu":
        workers = choose_workers(requested, device, slots_on_node, gpu_mb_per_worker)
        log.info("rows: %d per worker (automatic, CPU)", CPU_ROWS)
        return workers, CPU_ROWS
    by_cpu = gpu_slot_cores(slots_on_node)
    workers = requested or min(by_cpu, BATCHED_WORKERS_PER_GPU)
    budget = free_gpu_mb() * FREE_SHARE
    while True:
        rows = rows_that_fit(budget / workers, gpu_mb_per_worker, gpu_mb_per_row)
        if rows >= MIN_AUTO_ROWS or workers == 1 or requested:
            break
        workers -= 1
    log.info(
        "workers: %d (%s), rows: %d = min(%d, (%.0f%% of free GPU memory, %.0f MiB, / %d workers "
        "- %d MiB per worker) / %.0f MiB per row, in steps of 8)",
        workers,
        "set by config or --workers"
        if requested
        else f"min(cores {by_cpu}, {BATCHED_WORKERS_PER_GPU} batched workers per GPU), "
        f"fewer if rows fell under {MIN_AUTO_ROWS}",
        rows,
        AUTO_ROWS,
        FREE_SHARE * 100,
        budget,
        workers,
        gpu_mb_per_worker,
        gpu_mb_per_row,
    )
    return workers, rows


def rows_that_fit(worker_mb: float, gpu_mb_per_worker: int, gpu_mb_per_row: float) -> int:
    """Rows a worker with `worker_mb` of GPU memory holds: at most AUTO_ROWS, a multiple of 8 from 8 on, at least 1."""
    rows = int((worker_mb - gpu_mb_per_worker) // max(gpu_mb_per_row, 1.0))
    rows = min(AUTO_ROWS, rows)
    return rows - rows % 8 if rows >= 8 else max(1, rows)
