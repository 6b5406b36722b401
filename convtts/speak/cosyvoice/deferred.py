"""transformers, imported when something uses it rather than when the CosyVoice runtime loads.

cosyvoice's modules import names from transformers as they load (Qwen2ForCausalLM,
AutoModelForCausalLM, AutoTokenizer) that only CosyVoice2/3 call; Matcha-TTS's flow decoder brings
diffusers and lightning's torchmetrics, which import more (CLIP, BERT-score classes) for code
nothing here runs. Importing transformers drags in torch.distributed.tensor, torch._dynamo, sympy
and sklearn: most of the runtime's 11.4 s import on an H200 node
(bench/results/h200-2026-11-24-e2e-forkserver/importtime-runtime.txt), paid by every slot's
forkserver, and by every worker under spawn, before a v1 model speaks.

While a v1 model imports the runtime and builds its modules (`transformers_deferred`),
sys.modules["transformers"] is a stand-in: every name taken from it is a placeholder that imports
the real library at its first use (an attribute, a call, isinstance, a subclass). A dunder name
(`__version__`) or a submodule imports it at once. After the block the stand-in goes, so `import
transformers` anywhere else is the usual one. A v2/v3 load swaps the placeholders left in
cosyvoice's modules for the real classes first (`resolve_placeholders`), because it subclasses one.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import sys
import types

NAME = "transformers"
DYNAMO = "torch._dynamo"


@contextlib.contextmanager
def transformers_deferred(defer: bool = True):
    """The stand-in in place for the block, if `defer` and transformers is installed and not imported yet."""
    spec = importlib.util.find_spec(NAME) if defer and NAME not in sys.modules else None
    if spec is None:
        yield
        return
    stand_in = StandIn(spec)
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
def v1_imports_deferred(defer: bool = True):
    """What a v1 model's import does not need, kept out for the block: transformers (a stand-in) and
    torch._dynamo (hidden)."""
    with transformers_deferred(defer), dynamo_hidden(defer):
        yield


@contextlib.contextmanager
def dynamo_hidden(hide: bool = True):
    """torch._dynamo made unimportable for the block, unless it is imported already.

    diffusers (under Matcha-TTS's flow decoder) imports it only for `allow_in_graph`, a hint to
    torch.compile, and falls back to a decorator that changes nothing when the import fails. On an
    H200 node that import was 4.8-5.6 s of a slot's 11.7-13.9 s preload (torch._dynamo brings sympy;
    bench/results/h200-2026-11-26-engine-stages/importtime-*.txt), before any worker could start.
    torch.compile, if asked for, imports it later as usual.
    """
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
    if isinstance(current, StandIn):
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


class StandIn(types.ModuleType):
    """sys.modules["transformers"] until something needs the library."""

    def __init__(self, spec):
        super().__init__(NAME, "transformers, not imported yet (convtts.speak.cosyvoice.deferred)")
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
        if fullname.startswith(NAME + ".") and isinstance(sys.modules.get(NAME), StandIn):
            real_transformers()
        return None


_SUBMODULES = _SubmoduleFinder()
