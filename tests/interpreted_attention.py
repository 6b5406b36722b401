"""Runs the decode attention kernel in Triton's interpreter (no GPU here) against the torch step.

TRITON_INTERPRET must be set before Triton is imported, so this runs in a process of its own:

    TRITON_INTERPRET=1 python tests/interpreted_attention.py kernel
    TRITON_INTERPRET=1 python tests/interpreted_attention.py v1
    TRITON_INTERPRET=1 python tests/interpreted_attention.py qwen QWEN_DIR

`kernel`: the kernels on random caches (rows ending within a block, on block and split edges and
at the bucket's last position; v1's relative term; grouped-query heads) against the torch
attention the runners keep; `v1`, `qwen`: the static runner with the kernels, step by step,
against the same runner with the torch attention. Prints "ok" when everything agrees.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import torch

STEPS = 70  # with splits of 32 positions, past two of them


def numpy_scalars() -> None:
    """Triton 3.5's interpreter turns its one-element arrays into loop bounds with int(), which NumPy
    2.4 refuses for arrays of one dimension; take the element instead."""
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor

    def patched(tensor):
        patch(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])

    interpreter._patch_lang_tensor = patched


def reference(q, keys, values, lengths, length, scale, relative=None):
    """The torch attention of runner_v1.attend (relative) and runner_qwen.attend (grouped heads)."""
    rows, heads, dim = q.shape
    positions = torch.arange(length)
    beyond = positions[None, :] > lengths[:, None]
    keys, values = keys[:, :, :length], values[:, :, :length]
    if relative is not None:
        table, u, v = relative
        distance = (lengths[:, None] - positions[None, :]).clamp(0, length - 1)
        content = torch.matmul((q + u).unsqueeze(2), keys.transpose(-1, -2)).squeeze(2)
        position = torch.matmul((q + v).transpose(0, 1), table[:, :, :length]).transpose(0, 1)
        position = position.gather(2, distance.unsqueeze(1).expand(rows, heads, length))
        scores = ((content + position) * scale).masked_fill(beyond.unsqueeze(1), -float("inf"))
        return torch.matmul(torch.softmax(scores, dim=-1).unsqueeze(2), values).squeeze(2)
    grouped = q.view(rows, keys.shape[1], heads // keys.shape[1], dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)) * scale
    weights = torch.softmax(scores.masked_fill(beyond[:, None, None, :], -float("inf")), dim=-1)
    return torch.matmul(weights, values).reshape(rows, heads, dim)


def check_kernel() -> None:
    from convtts.speak.cosyvoice.engine import attention
    from convtts.speak.cosyvoice.engine.attention import decode_attention

    torch.manual_seed(5)
    rows, heads, dim, capacity, length = 7, 4, 64, 640, 600
    lengths = torch.tensor([0, 1, 63, 64, 255, 256, 599])  # within a block, on block and split edges, the last
    cache_k, cache_v = torch.randn(2, 3, rows, heads, capacity, dim).unbind(0)
    q = torch.randn(rows, 3, heads, dim)[:, 1]  # a view, as the runners' fused projection gives
    relative = (torch.randn(heads, dim, capacity), torch.randn(heads, dim), torch.randn(heads, dim))
    rows_first = (relative[0].transpose(1, 2).contiguous(), *relative[1:])  # the kernel's layout of the table
    got = decode_attention(q, cache_k[1], cache_v[1], lengths, length, 1 / math.sqrt(dim), rows_first)
    want = reference(q, cache_k[1], cache_v[1], lengths, length, 1 / math.sqrt(dim), relative)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    cache_k[1, :, :, length:] = float("nan")  # past the bucket: never read
    for row, n in enumerate(lengths.tolist()):
        cache_k[1, row, :, n + 1 : length] = float("nan")  # past a row's own position: never read either
    torch.testing.assert_close(
        decode_attention(q, cache_k[1], cache_v[1], lengths, length, 1 / math.sqrt(dim), rows_first), got
    )
    probe = attention.reference(q, cache_k[1], cache_v[1], lengths, length, 1 / math.sqrt(dim), rows_first)
    torch.testing.assert_close(probe, want, rtol=1e-5, atol=1e-5)  # the reference the runners' check uses
    groups = torch.randn(rows, 2, capacity, dim), torch.randn(rows, 2, capacity, dim)
    q6 = torch.randn(rows, 6, dim)
    torch.testing.assert_close(
        decode_attention(q6, *groups, lengths, length, 0.125),
        reference(q6, *groups, lengths, length, 0.125),
        rtol=1e-5,
        atol=1e-5,
    )


def check_probe() -> None:
    """The check a runner makes before it takes the kernel: it passes here, and refuses a head size the
    kernel cannot compile (not a power of two) and a kernel that raises, leaving torch's attention."""
    from convtts.speak.cosyvoice.engine import attention

    assert attention.works("cpu", 64, torch.float32, relative=True) and attention.works("cpu", 64, torch.float32, 3)
    assert not attention.works("cpu", 48, torch.float32)

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    attention.decode_attention = broken
    assert not attention.works("cpu", 32, torch.float32)


def check_runner(family: str, qwen_dir: str | None) -> None:
    """The static runner with the kernel against the same runner with the torch attention (which
    tests/test_cosyvoice_decode.py holds to upstream's decode): rows of three prompt lengths in rows
    0, 2 and 3, past splits of the kernel (64 positions here, so that the interpreter gets there
    quickly) and a cache growth; at step 40 a new sequence takes row 0."""
    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import qwen_llm, sequence, v1_llm
    from convtts.speak.cosyvoice.engine import attention

    attention.SPLIT, attention.BLOCK = 32, 16
    from convtts.speak.cosyvoice.engine.runner import DecodeOptions
    from convtts.speak.cosyvoice.engine.runner_qwen import QwenRunner
    from convtts.speak.cosyvoice.engine.runner_v1 import TransformerRunner

    llm = v1_llm(blocks=2, heads=2) if family == "v1" else qwen_llm(Path(qwen_dir))
    kind = TransformerRunner if family == "v1" else QwenRunner
    make = functools.partial(sequence, v1=family == "v1")
    runners = [
        kind(llm, torch.device("cpu"), "fp32", DecodeOptions(row_tokens=64, attention=a)) for a in ("triton", "torch")
    ]
    assert runners[0].kernel and not runners[1].kernel
    torch.manual_seed(3)
    with torch.inference_mode():
        rows = []
        for runner in runners:
            runner.prepare(4)
            rows.append([make(0, 5, 100), make(2, 9, 101), make(3, 14, 102)])
            for seq in rows[-1]:
                runner.prefill(seq)
        for step in range(STEPS):
            tokens = torch.randint(0, 100, (3,)).tolist()
            logps = []
            for runner, seqs in zip(runners, rows):
                if step == 40:
                    seqs[0] = make(0, 7, 103)
                    runner.prefill(seqs[0])
                for seq, token in zip(seqs, tokens):
                    seq.tokens.append(token)
                logps.append(runner.step(seqs))
            torch.testing.assert_close(logps[0], logps[1], rtol=1e-5, atol=1e-5, msg=f"step {step}")
    assert runners[0].cache.capacity > 128  # grown: the prompts and their decode bound


def main(argv: list[str]) -> int:
    numpy_scalars()
    if argv[0] == "kernel":
        check_kernel()
        check_probe()
    else:
        check_runner(argv[0], argv[1] if len(argv) > 1 else None)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
