"""The CUDA context a worker makes in a thread while its model loads (convtts.speak.cosyvoice.loading.CudaContext):
the load gets the thread's error, never a silent CPU model, and the phase is timed."""

from __future__ import annotations

import threading

import pytest
import torch

from convtts.speak.cosyvoice.loading import CudaContext, LoadClock


def direct_error() -> BaseException | None:
    """What making a context in this thread raises (None where it works)."""
    try:
        torch.empty(1, device="cuda")
    except BaseException as exc:
        return exc
    return None


def test_the_context_thread_hands_its_error_to_the_loading_thread_and_times_its_phase():
    expected = None if torch.cuda.is_available() else direct_error()
    clock = LoadClock()
    context = CudaContext(clock)
    if expected is None:  # a CUDA machine: the context is made
        context.wait()
        assert torch.cuda.is_initialized()
    else:
        with pytest.raises(type(expected)) as raised:
            context.wait()
        assert str(raised.value) == str(expected)
    assert not context.thread.is_alive()
    assert context.thread is not threading.current_thread()
    assert clock.phases["cuda"] >= 0.0


def test_a_loads_modules_phase_builds_on_the_clocks_device_and_nothing_else_does():
    """A v1 worker builds its modules on its GPU (LoadClock.modules_on); the CPU machine checks the
    mechanism with the meta device: what the modules phase makes lands there, other phases and code
    outside a load are left as upstream has them."""
    from convtts.speak.cosyvoice import loading

    build = loading._timed(lambda: torch.nn.Linear(4, 4), loading.MODULES)
    weights = loading._timed(lambda: torch.nn.Linear(4, 4), loading.WEIGHTS)
    clock = LoadClock(modules_on="meta")
    with loading.fast_load(clock):
        built, other = build(), weights()
    assert built.weight.device.type == "meta" and other.weight.device.type == "cpu"
    assert set(clock.phases) == {loading.MODULES, loading.WEIGHTS}
    assert build().weight.device.type == "cpu"  # no load under way
    with loading.fast_load(LoadClock()):
        assert build().weight.device.type == "cpu"  # a load that builds on the CPU
