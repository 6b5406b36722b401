"""How a CosyVoice model loads quickly in a worker: each phase timed, no work the weights overwrite or the voices
never use.

Upstream's constructor builds every module with random weights, reads each checkpoint into memory
and copies it over them, and opens two ONNX sessions in the frontend. On a full-size
CosyVoice-300M (CPU, 2 cores) the random fills took 7 of its 28 s; the Chinese text normaliser of
WeTextProcessing another 10 (wetext, on the GPU machines, is quick). What this module changes,
inside one load only:

- modules are built with zero fills instead of random ones (load_state_dict overwrites every
  parameter, strict for the flow and vocoder; an LLM key a checkpoint lacks is zero, not noise);
- a checkpoint in torch's zip format is mapped (torch.load(mmap=True)) while upstream's model loads
  its weights (tts.cosyvoice.map_weights, on): the weights come from the page cache, which every
  worker of the node shares and the slot warms (convtts.run.weights), and reach the GPU in one
  copy. On a full-size CosyVoice-300M (CPU, 2 cores, warm page cache) the weights took 0.4-0.6 s
  mapped against 3.6-5.0 s read. Upstream passes each checkpoint's path to torch.load, and torch has
  no setting for the map_location it also needs, so torch.load itself is wrapped for that step only;
  tests/test_mapped_weights.py fails when upstream's loads stop going through it;
- the campplus and speech-tokenizer sessions open when first used: SFT speakers use neither, a
  zero-shot voice opens them as it registers;
- text normalisers are built when first used, once per process (see upstream_patches.share_text_normalizers);
- the process's CUDA context is made in a thread while the process imports what is left and maps
  the weights (CudaContext);
- a v1 model's modules are built on the GPU it runs on (LoadClock.modules_on): on the CPU, a worker
  of a full-size CosyVoice-300M spent 2.4-3.2 s there allocating and zero-filling 1.74 GB, and
  1.1-1.5 s copying the mapped weights into those tensors and on to the GPU; on the GPU the weights
  go from the page cache to the GPU in one copy. Tables computed at construction (positional
  encodings) are then computed on the GPU. v2/v3 stay on the CPU: CosyVoice2's flow draws its
  fixed noise at construction, and on the GPU it would draw other numbers.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
import zipfile
from pathlib import Path

# Phases of a load: seconds by name, in the order they began. The CosyVoice backend adds cuda,
# engine and the rest; runtime.load_model the ones below.
IMPORTS, MODULES, FRONTEND, WEIGHTS = "imports", "modules", "frontend", "weights"
_RANDOM_FILLS = (
    "uniform_",
    "normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "xavier_uniform_",
    "xavier_normal_",
    "trunc_normal_",
    "orthogonal_",
)
_MODEL_LOADERS = ("load", "load_jit", "load_trt", "load_vllm")

_clock: LoadClock | None = None  # the load under way in this process, for the timed upstream steps


class LoadClock:
    """Seconds spent in each phase of one model load."""

    def __init__(self, modules_on: str | None = None, map_weights: bool = True):
        self.phases: dict[str, float] = {}
        self.active: set[str] = set()
        self.modules_on = modules_on  # the device the modules are built on (None: torch's default, the CPU)
        self.map_weights = map_weights  # the weights phase maps zip-format checkpoints (tts.cosyvoice.map_weights)

    @contextlib.contextmanager
    def phase(self, name: str):
        if name in self.active:  # an upstream step that calls another of its kind (super().load)
            yield
            return
        started = time.time()
        self.active.add(name)
        try:
            yield
        finally:
            self.active.discard(name)
            self.phases[name] = round(self.phases.get(name, 0.0) + time.time() - started, 3)


@contextlib.contextmanager
def fast_load(clock: LoadClock):
    """Around upstream's constructor: its steps timed into `clock`, zero fills; mapped checkpoints in its
    weights phase."""
    global _clock
    _clock = clock
    try:
        with _zero_fills():
            yield
    finally:
        _clock = None


class CudaContext:
    """This process's CUDA context, made in a thread (its `cuda` phase overlaps the load's others).

    Making a context takes 1-4 s on an H200 under MPS when a slot's workers start together, most
    of it in the driver with the GIL released, while the load's first steps (the runtime's patches,
    its remaining imports) need no context. The load's first use of the GPU waits for this one
    (torch.cuda initialises once, behind a lock): a v1 model's modules, built on the GPU, or else
    the move of the loaded modules; `wait` re-raises what the thread raised.
    """

    def __init__(self, clock: LoadClock):
        self.clock = clock
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._make, name="cuda-context", daemon=True)
        self.thread.start()

    def _make(self) -> None:
        import torch

        try:
            with self.clock.phase("cuda"):
                torch.empty(1, device="cuda")
        except BaseException as exc:  # re-raised in the loading thread by wait()
            self.error = exc

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def time_upstream_steps(module) -> None:
    """Time the constructor's steps: building modules (hyperpyyaml), the frontend, the weights."""
    if not getattr(module.load_hyperpyyaml, "convtts_timed", False):
        module.load_hyperpyyaml = _timed(module.load_hyperpyyaml, MODULES)
    if not getattr(module.CosyVoiceFrontEnd, "convtts_timed", False):
        module.CosyVoiceFrontEnd = _timed(module.CosyVoiceFrontEnd, FRONTEND)
    models = importlib.import_module("cosyvoice.cli.model")
    for cls in vars(models).values():
        if not isinstance(cls, type) or cls.__module__ != models.__name__:
            continue
        for name in _MODEL_LOADERS:
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "convtts_timed", False):
                setattr(cls, name, _timed(method, WEIGHTS))


def _timed(step, phase: str):
    def timed(*args, **kwargs):
        if _clock is None:
            return step(*args, **kwargs)
        mapped = phase == WEIGHTS and _clock.map_weights and WEIGHTS not in _clock.active  # once, outermost
        with (
            _clock.phase(phase),
            _built_on(_clock.modules_on if phase == MODULES else None),
            _mapped_checkpoints() if mapped else contextlib.nullcontext(),
        ):
            return step(*args, **kwargs)

    timed.convtts_timed = True
    timed.__wrapped__ = step
    return timed


@contextlib.contextmanager
def _built_on(device: str | None):
    """Tensors made without a device inside go to `device` (None: left as they are)."""
    if device is None:
        yield
        return
    import torch

    with torch.device(device):
        yield


@contextlib.contextmanager
def _zero_fills():
    """torch.nn.init's random fills write zeros instead: a memset, where the random numbers took
    seconds, for weights the checkpoint then overwrites."""
    import torch
    import torch.nn.init as init

    def zero(tensor, *args, **kwargs):
        with torch.no_grad():
            return tensor.zero_()

    saved = {name: getattr(init, name) for name in _RANDOM_FILLS if hasattr(init, name)}
    for name in saved:
        setattr(init, name, zero)
    try:
        yield
    finally:
        for name, fill in saved.items():
            setattr(init, name, fill)


@contextlib.contextmanager
def _mapped_checkpoints():
    """torch.load maps a zip-format checkpoint file instead of reading it (legacy files are read).

    The checkpoints stay on the CPU (upstream's load moves each module to the device after
    load_state_dict): the mapped pages are copied into the modules and go to the GPU once, where
    mapping them to the GPU first sent them there, back to the CPU modules and there again, and left
    the state dict's copy in torch's GPU cache.
    """
    import torch

    load = torch.load

    def mapped_load(f, *args, **kwargs):
        if "mmap" not in kwargs and isinstance(f, (str, Path)) and zipfile.is_zipfile(f):
            kwargs["mmap"] = True
            if not args:
                kwargs["map_location"] = "cpu"
        return load(f, *args, **kwargs)

    torch.load = mapped_load
    try:
        yield
    finally:
        torch.load = load


def lazy_onnx_sessions(frontend_module) -> None:
    """The frontend's onnxruntime sessions open on first use (upstream opens both in its constructor)."""
    real = getattr(frontend_module, "onnxruntime", None)
    if real is None or isinstance(real, _LazyOnnx):
        return
    frontend_module.onnxruntime = _LazyOnnx(real)


class _LazyOnnx:
    """onnxruntime, as upstream's frontend sees it, whose InferenceSession opens on first use."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def InferenceSession(self, *args, **kwargs):
        return LazySession(self._real.InferenceSession, args, kwargs)


class LazySession:
    """An onnxruntime session opened at its first use (get_inputs, run), once."""

    def __init__(self, opener, args: tuple, kwargs: dict):
        self._opener, self._args, self._kwargs = opener, args, kwargs
        self._session = None
        self._lock = threading.Lock()

    @property
    def opened(self) -> bool:
        return self._session is not None

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        with self._lock:
            if self._session is None:
                self._session = self._opener(*self._args, **self._kwargs)
        return getattr(self._session, name)
