"""Number formats of the batched engine's parts (tts.cosyvoice.precision): what each means, applied once per build.

- fp32: weights and arithmetic in IEEE fp32, TF32 off for matrix products and convolutions (the
  reference every other format is measured against);
- tf32: fp32 weights, matrix products and convolutions on TF32 tensor cores (10-bit mantissa
  inputs, fp32 accumulation); on a CPU the same as fp32;
- bf16 / fp16: a copy of the part's weights cast once, its inputs cast at the part's boundary and
  its output handed back in fp32; numerically sensitive pieces stay in fp32 (each part says which).

TF32 is a process-wide switch in PyTorch, so a part sets it for the span of its own calls
(`matmul_mode`) and puts back what it found: parts of one worker may differ. Upstream's modules
are never changed in place: the one-at-a-time path shares them.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

FORMATS = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def storage_dtype(precision: str) -> torch.dtype:
    """The dtype a part's weights and activations are held in."""
    try:
        return FORMATS[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; one of {sorted(FORMATS)}") from None


def is_reduced(precision: str) -> bool:
    """bf16 and fp16 run on a cast copy of the weights; fp32 and tf32 on upstream's own."""
    return storage_dtype(precision) != torch.float32


def _tf32_switches() -> list[tuple[object, str, object, object]]:
    """(owner, attribute, value for TF32 on, value for off) for matrix products and convolutions.

    The `allow_tf32` flags, which torch's inductor and other libraries read. PyTorch 2.9 added
    `fp32_precision` settings and refuses to read `allow_tf32` once those were set to something
    else; then the new ones are used.
    """
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    try:
        matmul.allow_tf32, cudnn.allow_tf32  # noqa: B018  (the read is the probe: it raises under the new API)
    except RuntimeError:  # someone set the new API: keep to it
        return [(matmul, "fp32_precision", "tf32", "ieee"), (cudnn.conv, "fp32_precision", "tf32", "ieee")]
    return [(matmul, "allow_tf32", True, False), (cudnn, "allow_tf32", True, False)]


@contextmanager
def matmul_mode(precision: str):
    """TF32 on for tf32, off for every other format, while the block runs; then as it was."""
    switches = _tf32_switches()
    saved = [getattr(owner, name) for owner, name, _, _ in switches]
    for owner, name, on, off in switches:
        setattr(owner, name, on if precision == "tf32" else off)
    try:
        yield
    finally:
        for (owner, name, _, _), value in zip(switches, saved):
            setattr(owner, name, value)


def fold_weight_norms(module: torch.nn.Module) -> torch.nn.Module:
    """Replace each parametrization (HiFT's weight norms) by the tensor it computes: the same
    values, computed once instead of at every call. Changes `module` in place: call it on a copy.

    torch's remove_parametrizations deletes the property from the parametrized class, which a
    deep copy shares with the original (the original would lose its weights); here only the
    copy's own objects change.
    """
    from torch.nn.utils import parametrize

    for sub in list(module.modules()):
        if not parametrize.is_parametrized(sub):
            continue
        values = {name: getattr(sub, name).detach().clone() for name in sub.parametrizations}
        del sub._modules["parametrizations"]
        sub.__class__ = sub.__class__.__bases__[0]  # the class before parametrize subclassed it
        for name, value in values.items():
            sub.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
    return module


def cast_copy(
    module: torch.nn.Module, precision: str, keep_fp32: tuple[str, ...] = (), fold: bool = False
) -> torch.nn.Module:
    """A copy of `module` with its weights in the format's dtype, except the named submodules;
    with `fold`, its weight norms folded first. Tensors held as plain attributes (HiFT's window,
    v3's 290 MB noise buffers) are shared with the original, not copied."""
    dtype = storage_dtype(precision)
    shared = {id(v): v for m in module.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)}
    twin = copy.deepcopy(module, memo=shared)
    if fold:
        fold_weight_norms(twin)
    # their own values, not ones rounded through the cast below and back
    kept = {name: {k: v.clone() for k, v in twin.get_submodule(name).state_dict().items()} for name in keep_fp32}
    twin.to(dtype)
    for name, values in kept.items():
        twin.get_submodule(name).float().load_state_dict(values)
    return twin.eval()


def part_module(module: torch.nn.Module, precision: str, keep_fp32: tuple[str, ...] = ()) -> torch.nn.Module:
    """The module a part runs: upstream's own in fp32/tf32, a cast copy in bf16/fp16."""
    return cast_copy(module, precision, keep_fp32) if is_reduced(precision) else module
