"""torch.compile's CPU kernels under two ATEN_CPU_CAPABILITY settings, one after the other, in fresh processes."""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys

import pytest

from conftest import script_env

# A decode step's shape of work: a norm and a projection, a write into a cache at each row's length,
# attention over it with positions past the length masked, written into a static output.
STEP = """
import torch
from convtts.cuda_graphs import compile_step

torch.manual_seed(0)
cache, out = torch.zeros(4, 4, 512, 8), torch.zeros(4, 32)
weight, x, lengths = torch.randn(32, 96), torch.randn(4, 32), torch.tensor([5, 9, 100, 300])
norm = torch.nn.LayerNorm(32)

def step(rows, length):
    q, k, _ = (norm(x[:rows]) @ weight).view(rows, 3, 4, 8).unbind(1)
    cache[:rows].scatter_(2, lengths[:rows].view(rows, 1, 1, 1).expand(rows, 4, 1, 8), k.unsqueeze(2))
    scores = torch.matmul(q.unsqueeze(2), cache[:rows, :, :length].transpose(-1, -2)) / 8 ** 0.5
    beyond = torch.arange(length)[None, :] > lengths[:rows, None]
    weights = torch.softmax(scores.masked_fill(beyond[:, None, None, :], -float("inf")), dim=-1)
    out[:rows] = torch.matmul(weights, cache[:rows, :, :length]).reshape(rows, 32) + x[:rows]

compiled = compile_step(step)
with torch.inference_mode():
    for length in (128, 256, 512):
        compiled(4, length)
print("sum", float(out.abs().sum()))
"""


def compiled_step(tmp_path, capability: str | None) -> float:
    env = script_env(TMPDIR=tmp_path)  # inductor's default cache is under the temporary directory
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    done = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (capability, done.returncode, done.stderr[-2000:])
    return float(re.search(r"^sum (\S+)$", done.stdout, re.MULTILINE).group(1))


@pytest.mark.slow  # two compiles: about 25 s on 2 cores
def test_kernels_compiled_by_a_default_run_are_not_loaded_under_another_capability(tmp_path):
    """A default run fills inductor's cache (AVX-512 kernels where the CPU has it); a run with
    ATEN_CPU_CAPABILITY=avx2 that loaded them died with SIGBUS. Each capability keeps its own."""
    default = compiled_step(tmp_path, None)
    avx2 = compiled_step(tmp_path, "avx2")
    assert avx2 == pytest.approx(default, rel=1e-5)  # another vector width rounds sums differently
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    kept_apart = tmp_path / f"torchinductor_{user}" / "cpu-avx2"
    assert kept_apart.is_dir() and os.listdir(kept_apart), "the avx2 run's kernels are not in a cache of their own"
