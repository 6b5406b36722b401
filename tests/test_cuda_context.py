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
