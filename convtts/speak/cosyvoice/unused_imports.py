"""Libraries the CosyVoice runtime imports as it loads that a model's workers need late or never.

A slot's forkserver imports the runtime before its first worker can fork, so every second of that
import is a second of every job's start. Five of the libraries it pulls in serve no SFT voice:

- `modelscope`: cosyvoice.cli.cosyvoice takes `snapshot_download` from it, which load_model
  replaces by a refusal anyway (model directories are local, never downloaded);
- `whisper`: the frontend imports the package for `log_mel_spectrogram` (a zero-shot prompt's
  speech tokens), and the v1 tokenizer takes `whisper.tokenizer`. The package's __init__ brings
  its model, decoding and timing code, and numba with them;
- `scipy.signal` (and scipy.stats under it): HiFT's generator takes `get_window` for its periodic
  Hann window, which `get_window` here computes itself, with the same operations;
- `librosa.filters` (and numba): Matcha-TTS's `mel_spectrogram` takes `mel` from it, used when a
  zero-shot prompt is registered;
- `scipy.io.wavfile` (and scipy.io's MATLAB readers): Matcha-TTS's audio module takes `read` from
  it, for its training data;
- and one call: diffusers (under Matcha-TTS's flow decoder) maps every installed package to its
  distribution as it loads (`importlib.metadata.packages_distributions`, reading each one's file
  list), for lookups of optional packages it makes later if ever. The map is read at its first
  use instead: on an H200 node diffusers' import_utils took 1.2 s, most of it that.

`kept_out()`, around the runtime's import and its model's construction, serves those names without
the libraries: the first use of any of them (a zero-shot prompt's mel, another window) imports the
real one then, and any other name asked of a stand-in imports it at once. After the block the
stand-ins leave sys.modules, so an import elsewhere is the usual one. `whisper` stays a light package
(as Matcha-TTS's `matcha.utils` does, convtts.speak.cosyvoice.matcha_utils): its submodules import
as usual and its __init__ runs at the first name it lacks.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Mapping

from convtts.config import ConfigError
from convtts.speak.cosyvoice.matcha_utils import LightPackage

WHISPER = "whisper"


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
        super().__init__(name, f"{name}, not imported yet (convtts.speak.cosyvoice.unused_imports)")
        self.__dict__.update(served)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)  # inspect.getmodule asks every module for __file__: no reason to import
        return getattr(real_module(self.__name__), name)
