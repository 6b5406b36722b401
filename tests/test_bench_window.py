"""The benchmarks' timed window (bench/throughput.py): the steady figure starts once every worker
has written, so a worker that holds its takes for the gate's batch is not charged for its first wait."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from throughput import MIN_STEADY_SECONDS, whole_job, windowed  # bench/ is not a package


def rows_of(worker: str, times: list[float], duration: float = 2.0) -> list[dict]:
    return [{"worker": worker, "finished": t, "duration": duration} for t in times]


def test_the_steady_figure_starts_at_the_last_workers_first_write():
    """w0 writes a row every second from t=1; w1 holds 20 takes and writes them at t=30, 50 and 70.
    Over the whole window w1's first wait counts against it; from t=30 on, only what came after."""
    rows = rows_of("w0", [float(t) for t in range(1, 81)]) + rows_of("w1", [30.0] * 20 + [50.0] * 20 + [70.0] * 20)
    figures = windowed(rows, 0.0, 80.0)
    assert figures["audio_seconds_per_second"] == round((80 + 60) * 2.0 / 80, 3)
    assert figures["steady_seconds"] == 50.0
    assert figures["steady_audio_seconds_per_second"] == round((50 + 40) * 2.0 / 50, 3)


def test_no_steady_figure_when_a_worker_wrote_too_late_to_measure():
    rows = rows_of("w0", [1.0, 2.0, 3.0]) + rows_of("w1", [80.0 - MIN_STEADY_SECONDS / 2])
    figures = windowed(rows, 0.0, 80.0)
    assert figures["steady_audio_seconds_per_second"] is None
    assert figures["audio_seconds_per_second"] == round(4 * 2.0 / 80, 3)


def test_a_whole_job_counts_every_row_over_the_commands_wall_time():
    """A job run to its end: rows held for the gate and written late, and the start-up before the
    first row, all count, over the wall time of the whole command."""
    rows = rows_of("w0", [5.0, 6.0, 7.0]) + rows_of("w1", [40.0] * 10)
    assert whole_job(rows, 50.0)["whole_job_audio_seconds_per_second"] == round(13 * 2.0 / 50.0, 3)
    assert whole_job([], 50.0)["whole_job_audio_seconds_per_second"] is None


def test_the_end_to_end_bench_gives_each_workers_gpu_memory_peak():
    """bench/e2e.py reads each worker's largest gpu_mb from the manifest rows (what max_gpu_mb is
    compared with); rows of a CPU run (0) give nothing, and the printout leaves the line out."""
    from e2e import gpu_mb_peak

    rows = [
        {"worker": "slot0-w1", "gpu_mb": 15000.0},
        {"worker": "slot0-w0", "gpu_mb": 16008.5},
        {"worker": "slot0-w1", "gpu_mb": 17420.0},
        {"worker": "slot0-w0", "gpu_mb": 9000.0},
    ]
    assert gpu_mb_peak(rows) == {"slot0-w0": 16008.5, "slot0-w1": 17420.0}
    assert gpu_mb_peak([{"worker": "slot0-w0", "gpu_mb": 0.0}, {"worker": "slot0-w1"}]) == {}
