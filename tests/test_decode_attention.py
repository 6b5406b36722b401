"""The decode step's attention kernel (engine/attention.py) against the torch step, in Triton's interpreter.

The kernel reads each row's own cache positions only; these run it without a GPU (Triton's
interpreter, in a process of its own: see tests/interpreted_attention.py) against the torch
attention, and inside the static runners against upstream's own decode, step by step, in fp32.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need

need("triton", "cosyvoice")

SCRIPT = Path(__file__).with_name("interpreted_attention.py")


def interpreted(*args: str) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]


def test_the_kernel_reads_each_rows_own_positions_and_matches_the_torch_attention():
    """v1's relative-position scores and grouped-query heads, rows ending within a block, on a block's
    edge and at the bucket's last position; positions past a row's end hold NaN and change nothing."""
    interpreted("kernel")


@pytest.mark.cosyvoice
@pytest.mark.slow  # the interpreter runs each program in NumPy: 90 s on 2 cores
def test_the_v1_step_with_the_kernel_is_upstreams_forward_chunk():
    interpreted("v1")


@pytest.mark.cosyvoice
@pytest.mark.slow
def test_the_qwen_step_with_the_kernel_is_the_backbones_decode_step(qwen_dir):
    interpreted("qwen", str(qwen_dir))
