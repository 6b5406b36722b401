"""Matcha-TTS's `matcha.utils` package without the training tools its __init__ imports.

CosyVoice's flow (every version) imports Matcha-TTS's flow-matching module, which takes one helper
from `matcha.utils.pylogger`. Python runs the package's __init__ first, and that imports the
training tools: lightning, hydra, omegaconf, rich, gdown, wget and matplotlib.pyplot, and the
helper's own module imports lightning once more. None of it runs while a model speaks, and on 2
cores it was 1.5 s of the 4.3 s that Matcha-TTS's modules took to import (lightning and matplotlib
most of it); a slot's forkserver pays it before any worker forks.

`install()` puts two modules in sys.modules before the runtime imports, if neither is there yet:

- `matcha.utils` as a package whose submodules import as usual (audio, model, ...) and whose
  __init__ runs at the first name it lacks (`from matcha.utils import instantiate_callbacks`), so
  the training tools still import for whoever asks for them;
- `matcha.utils.pylogger`, whose `get_pylogger` is the logger Matcha-TTS's would be in one process:
  its rank-zero wrapper lets every call through in a process of rank 0, the only kind here.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path

PACKAGE = "matcha.utils"
PYLOGGER = "matcha.utils.pylogger"


def install() -> bool:
    """Put the light package and logger module in place; False where Matcha-TTS is missing or already imported."""
    if PACKAGE in sys.modules or PYLOGGER in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except ImportError:
        return False
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    package = LightPackage(spec)
    sys.modules[PACKAGE] = package
    sys.modules["matcha"].utils = package  # as an import binds it (pydoc.locate walks attributes)
    sys.modules[PYLOGGER] = package.pylogger = _pylogger()
    return True


class LightPackage(types.ModuleType):
    """`matcha.utils` whose __init__ runs when a name it lacks is asked for (submodules import as usual)."""

    def __init__(self, spec):
        super().__init__(spec.name)
        self.__spec__, self.__loader__, self.__file__ = spec, spec.loader, spec.origin
        self.__path__ = list(spec.submodule_search_locations)
        self.__package__ = spec.name
        self._completed = False

    def __getattr__(self, name):
        if name.startswith("__") or self._completed or self._submodule(name):
            raise AttributeError(name)  # a submodule: the import system loads it next
        self._completed = True
        self.__spec__.loader.exec_module(self)  # the real __init__, in this module's namespace
        return getattr(self, name)

    def _submodule(self, name: str) -> bool:
        return any(
            (Path(folder) / f"{name}.py").is_file() or (Path(folder) / name).is_dir() for folder in self.__path__
        )


def _pylogger() -> types.ModuleType:
    module = types.ModuleType(
        PYLOGGER, "Matcha-TTS's get_pylogger for one process (convtts.speak.cosyvoice.matcha_utils)"
    )
    module.get_pylogger = get_pylogger
    return module


def get_pylogger(name: str = __name__) -> logging.Logger:
    return logging.getLogger(name)
