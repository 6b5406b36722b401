"""Stand-ins in sys.modules while the CosyVoice runtime imports, for libraries a model's workers need late or never.

A slot's forkserver imports the runtime before its first worker can fork, so every second of that
import is a second of every job's start. `held_back(version)`, around the runtime's import, the
modules its yaml names and its model's construction (convtts.speak.cosyvoice.runtime), keeps out:

- for a v1 model, transformers (`transformers_deferred`): cosyvoice's modules take names from it
  (Qwen2ForCausalLM, AutoTokenizer) that only CosyVoice2/3 call, and Matcha-TTS's flow decoder
  brings diffusers and torchmetrics, which take more (CLIP, BERT-score classes). Every name taken
  from the stand-in is a placeholder that imports the real library at its first use (an attribute, a
  call, isinstance, a subclass); a dunder name (`__version__`) or a submodule imports it at once. A
  v2/v3 load swaps the placeholders left in cosyvoice's modules for the real classes first
  (`resolve_placeholders`), because it subclasses one;
- for a v1 model, torch._dynamo (`dynamo_hidden`): diffusers imports it only for `allow_in_graph`,
  a torch.compile hint, and falls back to a decorator that changes nothing when the import fails
  (torch._dynamo brings sympy). torch.compile, if asked for, imports it later as usual;
- for every version (`kept_out`), libraries no voice needs as it loads: `modelscope` (its
  `snapshot_download`, refused anyway: model directories are local), `whisper`'s package (the
  frontend's `log_mel_spectrogram`, a zero-shot prompt's; its __init__ brings the model, decoding
  and numba: a light package instead, whose __init__ runs at the first name it lacks),
  `scipy.signal` (HiFT's periodic Hann window, computed here as scipy does), `librosa.filters`
  (Matcha-TTS's mel filters, for a zero-shot prompt) and `scipy.io.wavfile` (Matcha-TTS's wav
  reader, for training data); and diffusers' map of installed packages to distributions
  (`importlib.metadata.packages_distributions`), read at its first use instead of as it loads.
  Each library imports at the first use of a name it serves; any other name asked of a stand-in
  imports it at once.

After the block the stand-ins leave sys.modules, so an import elsewhere is the usual one; a library
already imported is left alone. What each saves, in fresh processes: `bench/import_standins.py`
(figures in docs/PERFORMANCE.md). tests/test_standins.py fails when the installed runtime asks a
stand-in for a name it does not serve.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Mapping

from convtts.config import ConfigError
from convtts.speak.cosyvoice.matcha_utils import LightPackage

NAME = "transformers"
DYNAMO = "torch._dynamo"
WHISPER = "whisper"


@contextlib.contextmanager
def held_back(version: int | None, enabled: bool = True):
    """Every stand-in that applies to a model of this version, in place for the block (none: `enabled`
    false, tts.cosyvoice.standins)."""
    if not enabled:
        yield
        return
    with transformers_deferred(version == 1), dynamo_hidden(version == 1), kept_out():
        yield


# -- transformers and torch._dynamo (v1) ------------------------------------------------------------


@contextlib.contextmanager
def transformers_deferred(defer: bool = True):
    """The stand-in in place for the block, if `defer` and transformers is installed and not imported yet."""
    spec = importlib.util.find_spec(NAME) if defer and NAME not in sys.modules else None
    if spec is None:
        yield
        return
    stand_in = TransformersStandIn(spec)
    sys.modules[NAME] = stand_in
    sys.meta_path.insert(0, _SUBMODULES)
    try:
        yield
    finally:
        if sys.modules.get(NAME) is stand_in:
            del sys.modules[NAME]
        if _SUBMODULES in sys.meta_path:
            sys.meta_path.remove(_SUBMODULES)


@contextlib.contextmanager
def dynamo_hidden(hide: bool = True):
    """torch._dynamo made unimportable for the block, unless it is imported already."""
    if not hide or DYNAMO in sys.modules:
        yield
        return
    sys.modules[DYNAMO] = None  # `import torch._dynamo` raises ImportError while this is there
    try:
        yield
    finally:
        if DYNAMO in sys.modules and sys.modules[DYNAMO] is None:
            del sys.modules[DYNAMO]


def real_transformers() -> types.ModuleType:
    """The real transformers module, imported now if only the stand-in was there."""
    current = sys.modules.get(NAME)
    if isinstance(current, TransformersStandIn):
        del sys.modules[NAME]
    if _SUBMODULES in sys.meta_path:
        sys.meta_path.remove(_SUBMODULES)
    return importlib.import_module(NAME)


def resolve_placeholders(prefix: str = "cosyvoice") -> None:
    """Swap every placeholder held by a module under `prefix` for the class it stands for."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == prefix or name.startswith(prefix + ".")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, Placeholder):
                setattr(module, attr, value.resolve())


class Placeholder:
    """A transformers name that imports the library at its first use."""

    def __init__(self, name: str):
        self._name = name

    def resolve(self):
        return getattr(real_transformers(), self._name)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.resolve(), attr)

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __instancecheck__(self, obj) -> bool:
        return isinstance(obj, self.resolve())

    def __subclasscheck__(self, cls) -> bool:
        return issubclass(cls, self.resolve())

    def __mro_entries__(self, bases) -> tuple:
        return (self.resolve(),)  # `class X(placeholder)` subclasses the real class

    def __repr__(self) -> str:
        return f"<transformers.{self._name}, not imported yet>"


class TransformersStandIn(types.ModuleType):
    """sys.modules["transformers"] until something needs the library."""

    def __init__(self, spec):
        super().__init__(NAME, "transformers, not imported yet (convtts.speak.cosyvoice.standins)")
        self.__spec__ = spec  # importlib.util.find_spec("transformers") still answers
        self.__file__ = spec.origin  # inspect.getmodule reads every module's (torch's custom ops ask it)
        # a package's path: `from transformers import X` then looks X up here; a submodule import
        # reaches _SUBMODULES, which imports the real package first
        self.__path__ = list(spec.submodule_search_locations or [])

    def __getattr__(self, name):
        if name.startswith("__"):
            return getattr(real_transformers(), name)  # __version__ and the like: the asker uses the library
        return Placeholder(name)


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    """A submodule of transformers is asked for: import the real package, then let the usual finders work."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(NAME + ".") and isinstance(sys.modules.get(NAME), TransformersStandIn):
            real_transformers()
        return None


_SUBMODULES = _SubmoduleFinder()


# -- libraries no voice needs as it loads (every version) ------------------------------------------


@contextlib.contextmanager
def kept_out():
    """The stand-ins in sys.modules for the block (each only where its library is not imported yet)."""
    installed = {}
    for name, served in _served().items():
        if name not in sys.modules:
            sys.modules[name] = installed[name] = StandIn(name, served)
    light_whisper()
    read_map = importlib.metadata.packages_distributions
    importlib.metadata.packages_distributions = lambda: PackageMap(read_map)
    try:
        yield
    finally:
        importlib.metadata.packages_distributions = read_map
        for name, stand_in in installed.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


def light_whisper() -> bool:
    """`whisper` as a light package, unless it is imported already or not installed."""
    if WHISPER in sys.modules:
        return False
    spec = importlib.util.find_spec(WHISPER)
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    sys.modules[WHISPER] = LightPackage(spec)
    return True


def _served() -> dict[str, dict]:
    return {
        "modelscope": {"snapshot_download": refuse_download},
        "scipy.signal": {"get_window": get_window},
        "librosa.filters": {"mel": Deferred("librosa.filters", "mel")},
        "scipy.io.wavfile": {"read": Deferred("scipy.io.wavfile", "read")},
    }


def refuse_download(model_id, *args, **kwargs):
    """ModelScope's snapshot_download as a load sees it (here and in runtime.load_model): never a download."""
    raise ConfigError(f"CosyVoice tried to download {model_id!r}: model directories must exist locally")


def get_window(window, nx, fftbins=True):
    """scipy.signal.get_window for ("hann", N, fftbins=True), computed as scipy does (a cosine sum over
    N + 1 points from -pi to pi, the last dropped); any other window is scipy's own."""
    if window == "hann" and fftbins and isinstance(nx, int) and nx > 1:
        import numpy as np

        fac = np.linspace(-np.pi, np.pi, nx + 1)
        w = np.zeros(nx + 1)
        for k, a in enumerate((0.5, 0.5)):  # scipy's general_cosine: a0 + a1 cos(fac), alternating signs
            w += a * np.cos(k * fac)
        return w[:-1]
    return real_module("scipy.signal").get_window(window, nx, fftbins=fftbins)


def real_module(name: str) -> types.ModuleType:
    """The real module, imported now if only a stand-in was there."""
    if isinstance(sys.modules.get(name), StandIn):
        del sys.modules[name]
    return importlib.import_module(name)


class PackageMap(Mapping):
    """importlib.metadata.packages_distributions(), read at its first use."""

    def __init__(self, read):
        self._read, self._map = read, None

    def _loaded(self) -> Mapping:
        if self._map is None:
            self._map = self._read()
        return self._map

    def __getitem__(self, key):
        return self._loaded()[key]

    def __iter__(self):
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())


class Deferred:
    """A function of a module not imported yet: the module imports at the first call."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __call__(self, *args, **kwargs):
        return getattr(real_module(self.module), self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.module}.{self.name}, not imported yet>"


class StandIn(types.ModuleType):
    """sys.modules[name] while the runtime imports: the names it serves, and the real module for any other."""

    def __init__(self, name: str, served: dict):
        super().__init__(name, f"{name}, not imported yet (convtts.speak.cosyvoice.standins)")
        self.__dict__.update(served)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)  # inspect.getmodule asks every module for __file__: no reason to import
        return getattr(real_module(self.__name__), name)
