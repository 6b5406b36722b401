"""The decode step's attention kernel (engine/attention.py) against the torch step, and the flow's and the
vocoder's kernels (engine/modulate.py, groupnorm.py, framenorm.py, snake.py) against their torch paths, in
Triton's interpreter.

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

from conftest import COSYVOICE_CHECKOUT, need

need("triton", "cosyvoice")

SCRIPT = Path(__file__).with_name("interpreted_attention.py")


def interpreted(*args: str, script: Path = SCRIPT) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-4000:]


def test_the_dit_gated_modulate_kernel_matches_its_torch_path():
    """v3's residual, layer norm and modulation in one kernel (engine/modulate.py): within float
    rounding in fp32 and a bf16 step in bf16, for rows of a width that is not a power of two."""
    interpreted(script=SCRIPT.with_name("interpreted_modulate.py"))


def test_a_padded_dit_pass_through_the_kernel_gives_each_row_upstreams_frames():
    """A small DiT's padded pass with the kernels between its products (and its attention's, over each row's
    own frames): each row within float rounding of upstream's DiT.forward alone (the checkout: CosyVoice3
    is not on PyPI)."""
    if not COSYVOICE_CHECKOUT:
        pytest.skip("needs a checkout of the official CosyVoice repository: COSYVOICE_ROOT=/path/to/CosyVoice")
    interpreted("dit", COSYVOICE_CHECKOUT, script=SCRIPT.with_name("interpreted_modulate.py"))


def test_the_unet_block_norm_kernel_matches_its_torch_path():
    """v1's block after its convolution (bias, masked group norm, Mish, time embedding, mask, residual) in one
    kernel (engine/groupnorm.py): within its one rounding of the torch path in fp32, in fp32 and bf16."""
    interpreted("blocknorm", script=SCRIPT.with_name("interpreted_modulate.py"))


@pytest.mark.cosyvoice
def test_v2s_causal_block_kernel_matches_upstreams_block():
    """v2's CausalBlock1D after its convolution (bias, layer norm over each frame, Mish, time embedding, mask,
    residual) in one kernel (engine/framenorm.py), its convolution padding itself: within float rounding of
    upstream's block in fp32, a bf16 step in bf16, for a width that is not a power of two."""
    interpreted("framenorm", script=SCRIPT.with_name("interpreted_modulate.py"))


@pytest.mark.cosyvoice
def test_padded_unet_passes_through_the_kernels_give_each_row_its_own_frames():
    """Small v1 and v2 U-Nets with the block-norm, gated-modulate and flow attention kernels: each row of a
    padded pass within float rounding of the row alone through upstream's forward."""
    interpreted("unet", script=SCRIPT.with_name("interpreted_modulate.py"))


@pytest.mark.cosyvoice
def test_hifts_snake_kernel_matches_upstreams_snake():
    """HiFT's Snake in one kernel (engine/snake.py): within its one rounding of upstream's arithmetic, alphas
    on both scales; a ResBlock as the vocoder's copy runs it (Snakes, biases, masks and residuals in the
    kernel) gives upstream's block's output."""
    interpreted("snake", script=SCRIPT.with_name("interpreted_modulate.py"))


def test_the_flow_attention_kernel_reads_each_rows_own_frames():
    """The flow's attention in one kernel (engine/flow_attention.py): each row of a padded pass within float
    rounding of its attention alone, NaN in the padding changing nothing, zeros past each row's end; a
    kernel that will not compile leaves the attention to torch. The U-Net and DiT passes above run it too."""
    interpreted("flowattention", script=SCRIPT.with_name("interpreted_modulate.py"))


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
