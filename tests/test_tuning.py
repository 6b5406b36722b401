"""The automatic worker count: cores on CPU; on a GPU also free memory over a worker's peak, logged with reasons."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from convtts.run.tuning import MAX_WORKERS_PER_GPU, choose_workers, cpu_cores


@pytest.fixture
def free_gpu(tmp_path, monkeypatch):
    """An nvidia-smi that reports the given free MiB for the GPU it is asked about."""

    def install(free_mb: int) -> None:
        script = tmp_path / "nvidia-smi"
        script.write_text(f'#!/bin/sh\ncase "$*" in *--id=3*memory.free*) echo {free_mb} ;; *) exit 9 ;; esac\n')
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")

    return install


def test_requested_count_wins(caplog):
    with caplog.at_level(logging.INFO):
        assert choose_workers(7, "cuda", 1, 2600) == 7
    assert "set by config" in caplog.text


def test_cpu_slots_share_the_cores():
    assert choose_workers(0, "cpu", 1, 2600) == cpu_cores()
    assert choose_workers(0, "cpu", cpu_cores() * 4, 2600) == 1


def test_gpu_count_is_bounded_by_free_memory(free_gpu, caplog, monkeypatch):
    monkeypatch.setattr("convtts.run.tuning.cpu_cores", lambda: 64)
    free_gpu(10_000)
    with caplog.at_level(logging.INFO):
        assert choose_workers(0, "cuda", 1, 3000) == 3  # 90% of 10000 MiB holds three 3000 MiB workers
    assert "10000 MiB free" in caplog.text and "3000 MiB per worker" in caplog.text
    free_gpu(140_000)
    assert choose_workers(0, "cuda", 1, 2600) == MAX_WORKERS_PER_GPU
    assert choose_workers(0, "cuda", 8, 2600) == 7  # (64 cores - 2 spare) shared by 8 slots
    monkeypatch.setattr("convtts.run.tuning.cpu_cores", lambda: 16)
    assert choose_workers(0, "cuda", 1, 2600) == 14  # one H200 on a 16-core node: the measured setting


def test_unreadable_gpu_memory_means_one_worker(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all
    monkeypatch.setattr("convtts.run.tuning.cpu_cores", lambda: 64)
    with caplog.at_level(logging.WARNING):
        assert choose_workers(0, "cuda", 1, 2600) == 1
    assert "could not read free GPU memory" in caplog.text


def test_a_batched_worker_counts_its_rows_and_the_log_says_so(caplog):
    from convtts.run.tuning import worker_gpu_mb

    caplog.set_level("INFO")
    assert worker_gpu_mb(2600, 500, 1) == 2600 and "rows" not in caplog.text
    assert worker_gpu_mb(2600, 500, 32) == 2600 + 31 * 500
    assert "a worker of 32 rows needs about 18100 MiB" in caplog.text
    # the shipped GPU config on an H200 (143,156 MiB free) gives the 7 workers its README run measured
    from convtts.config import load_config
    from convtts.speak import backend_rows

    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "cosyvoice.yaml", ["tts.cosyvoice.model_dir=m"])
    w = config.workers
    assert int(143156 * 0.9 // worker_gpu_mb(w.gpu_mb_per_worker, w.gpu_mb_per_row, backend_rows(config))) == 7
