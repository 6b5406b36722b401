"""How a slot starts its workers and how they wait for the GPU: checked up front, and harmless off a GPU."""

from __future__ import annotations

import ctypes.util

import pytest

from convtts.config import ConfigError, WorkerConfig
from convtts.run.memory import cap_gpu_memory
from convtts.run.worker_setup import set_cuda_sync


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("start_method", "fork", "workers.start_method must be one of"),
        ("cuda_sync", "busy", "workers.cuda_sync must be one of"),
        ("hold_release", 0.0, "workers.hold_release must be above 0 and at most 1"),
        ("hold_release", 1.5, "workers.hold_release must be above 0 and at most 1"),
        ("gpu_mb_cap", -1, "must not be negative"),
    ],
)
def test_worker_settings_are_checked_up_front(key, value, message):
    with pytest.raises(ConfigError, match=message):
        WorkerConfig(**{key: value}).check()
    WorkerConfig(start_method="spawn", cuda_sync="block", hold_release=0.5).check()


def test_cuda_sync_leaves_the_driver_alone_on_auto_and_without_a_driver():
    assert set_cuda_sync("auto") is False
    if ctypes.util.find_library("cuda") is None:  # a CPU machine: nothing to set, nothing raised
        assert set_cuda_sync("block") is False


def test_a_gpu_memory_cap_of_0_or_without_a_gpu_sets_nothing():
    torch = pytest.importorskip("torch")
    assert cap_gpu_memory(0) is None
    if not torch.cuda.is_available():
        assert cap_gpu_memory(4000) is None
