"""Finds the CosyVoice runtime and loads a model directory with it, never reaching the network."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
from pathlib import Path

from convtts.config import ConfigError, CosyVoiceConfig
from convtts.speak.cosyvoice import matcha_utils, upstream_patches
from convtts.speak.cosyvoice.loading import IMPORTS, LoadClock, fast_load, lazy_onnx_sessions, time_upstream_steps
from convtts.speak.cosyvoice.standins import held_back, refuse_download, resolve_placeholders

log = logging.getLogger(__name__)

# The yaml file a model directory holds says which generation (and upstream class) it is.
VERSION_YAML = {1: "cosyvoice.yaml", 2: "cosyvoice2.yaml", 3: "cosyvoice3.yaml"}
CLASS_NAME = {1: "CosyVoice", 2: "CosyVoice2", 3: "CosyVoice3"}
# What each constructor opens besides the yaml (spk2info.pt is optional: only SFT models have it).
WEIGHTS = ("llm.pt", "flow.pt", "hift.pt", "campplus.onnx")
TOKENIZER = {1: "speech_tokenizer_v1.onnx", 2: "speech_tokenizer_v2.onnx", 3: "speech_tokenizer_v3.onnx"}
LOAD_OPTIONS = ("fp16", "load_jit", "load_trt", "load_vllm")


def runtime_root(cosy: CosyVoiceConfig) -> Path | None:
    """The checkout named by tts.cosyvoice.runtime_root or $COSYVOICE_ROOT; None: the installed package."""
    raw = cosy.runtime_root or os.environ.get("COSYVOICE_ROOT", "")
    if not raw:
        return None
    root = Path(raw).expanduser().resolve()
    where = "tts.cosyvoice.runtime_root" if cosy.runtime_root else "$COSYVOICE_ROOT"
    if not (root / "cosyvoice" / "cli" / "cosyvoice.py").is_file():
        raise ConfigError(f"{where} = {raw!r} is not a CosyVoice checkout: {root}/cosyvoice/cli/cosyvoice.py not found")
    if not (root / "third_party" / "Matcha-TTS" / "matcha").is_dir():
        raise ConfigError(
            f"{where} = {raw!r} lacks third_party/Matcha-TTS/matcha "
            "(clone with --recursive or run git submodule update --init)"
        )
    return root


def check_runtime(cosy: CosyVoiceConfig) -> None:
    """Cheap, import-free check that a runtime is there (the parent never imports torch models)."""
    if runtime_root(cosy) is not None:
        return
    if importlib.util.find_spec("cosyvoice") is None or importlib.util.find_spec("matcha") is None:
        raise ConfigError(
            "the CosyVoice runtime is not installed: set tts.cosyvoice.runtime_root (or $COSYVOICE_ROOT) "
            "to a checkout of the official repository, or pip install --no-deps cosyvoice2-eu"
        )


def go_offline() -> None:
    """Belt and braces: the model directory is checked first, but nothing may ever download."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"


def import_runtime(cosy: CosyVoiceConfig, version: int | None = None):
    """Import and return the `cosyvoice.cli.cosyvoice` module from the configured place.

    Libraries the model's workers need late or never stay out of it (convtts.speak.cosyvoice.standins).
    """
    root = runtime_root(cosy)
    check_runtime(cosy)
    go_offline()
    provide_tn_from_wetext()
    import_inflect_unchecked()
    if root is not None:
        loaded = sys.modules.get("cosyvoice")
        if loaded is not None and not _inside(loaded, root):
            raise ConfigError(
                f"another cosyvoice package is already imported from {_origin(loaded)}; "
                f"cannot switch to the checkout {root} in this process"
            )
        # Both at the front: a checkout must win over an installed copy of the same packages.
        for path in (str(root / "third_party" / "Matcha-TTS"), str(root)):
            if path not in sys.path:
                sys.path.insert(0, path)
    matcha_utils.install()  # Matcha-TTS's training tools stay unimported
    try:
        with held_back(version, cosy.standins):
            module = importlib.import_module("cosyvoice.cli.cosyvoice")
    except ImportError as exc:
        raise ConfigError(f"the CosyVoice runtime failed to import: {exc}") from exc
    if root is not None and not _inside(sys.modules["cosyvoice"], root):
        raise ConfigError(f"cosyvoice was imported from {_origin(sys.modules['cosyvoice'])}, not from {root}")
    return module


def import_inflect_unchecked() -> None:
    """Import inflect (the frontend's number speller) without typeguard's argument checks.

    inflect 7 wraps its methods in typeguard's @typechecked, which rewrites each one's code as the
    module loads: 4.4 s of a worker's start on 2 cores, 0.15 s without (the checks only guard the
    types of its arguments, which upstream passes right). typeguard itself skips them under -O.
    """
    if "inflect" in sys.modules or importlib.util.find_spec("inflect") is None:
        return
    try:
        import typeguard
    except ImportError:
        return
    checked = typeguard.typechecked

    def unchecked(target=None, **options):
        return target if target is not None else (lambda function: function)

    typeguard.typechecked = unchecked
    try:
        importlib.import_module("inflect")
    finally:
        typeguard.typechecked = checked


def _origin(module) -> str:
    """Where a module or package was imported from (a namespace package has no __file__)."""
    if getattr(module, "__file__", None):
        return str(Path(module.__file__).parent)
    return str(next(iter(getattr(module, "__path__", [])), "?"))


def _inside(module, root: Path) -> bool:
    return Path(_origin(module)).resolve().is_relative_to(root)


# WeTextProcessing's Chinese normaliser options and their defaults there (all off in wetext).
ZH_DEFAULTS = dict(
    remove_interjections=True,
    remove_erhua=True,
    traditional_to_simple=True,
    remove_puncts=False,
    full_to_half=True,
    tag_oov=False,
)


def provide_tn_from_wetext() -> bool:
    """Serve `tn` (WeTextProcessing) from wetext when only the latter is installed.

    cosyvoice2-eu's frontend imports tn.chinese / tn.english normalisers at module load; tn needs
    pynini, a 165 MB wheel. wetext is its runtime twin (same grammars as prebuilt FSTs on
    kaldifst, 7 MB, and what the official frontend now imports): same text out, no FST building.
    """
    served = sys.modules.get("tn")
    if served is not None:  # imported already, or served by an earlier load in this process (a rebuild)
        return "wetext" in (served.__doc__ or "")  # our stand-in has no __spec__: find_spec would raise
    if importlib.util.find_spec("tn") or importlib.util.find_spec("ttsfrd") or not importlib.util.find_spec("wetext"):
        return False
    import types

    from wetext import Normalizer

    def normaliser(lang: str, defaults: dict):
        class TextNormalizer:
            convtts_shared = True  # wetext caches its FSTs itself: nothing to share

            def __init__(self, cache_dir=None, overwrite_cache=False, **options):
                unknown = set(options) - set(defaults)
                if unknown:
                    raise TypeError(f"unexpected normaliser options {sorted(unknown)}")
                self.wetext = Normalizer(lang=lang, operator="tn", **{**defaults, **options})

            def normalize(self, text: str) -> str:
                return self.wetext.normalize(text)

        TextNormalizer.__name__ = f"{lang.capitalize()}Normalizer"
        return TextNormalizer

    classes = {"chinese": normaliser("zh", ZH_DEFAULTS), "english": normaliser("en", {})}
    sys.modules["tn"] = types.ModuleType("tn", "WeTextProcessing's normalisers, served by wetext (convtts)")
    for group, cls in classes.items():
        package = types.ModuleType(f"tn.{group}")
        module = types.ModuleType(f"tn.{group}.normalizer")
        module.Normalizer = cls
        package.normalizer = module
        setattr(sys.modules["tn"], group, package)
        sys.modules[f"tn.{group}"], sys.modules[f"tn.{group}.normalizer"] = package, module
    log.info("tn (WeTextProcessing) not installed: text normalisation served by wetext")
    return True


def model_version(model_dir: str) -> int:
    """1, 2 or 3, from the yaml the directory holds; ConfigError if it is not a model directory."""
    path = Path(model_dir)
    if not model_dir or not path.is_dir():
        raise ConfigError(f"CosyVoice model directory not found: {model_dir!r} (tts.cosyvoice.model_dir)")
    found = [v for v, name in VERSION_YAML.items() if (path / name).is_file()]
    if not found:
        raise ConfigError(f"{model_dir} holds none of {', '.join(VERSION_YAML.values())}: not a CosyVoice model")
    return max(found)


def required_files(version: int, cosy: CosyVoiceConfig) -> list[str]:
    """Files the constructor opens for this version and these load options (relative names)."""
    files = [VERSION_YAML[version], *WEIGHTS, TOKENIZER[version]]
    if version >= 2:
        files.append("CosyVoice-BlankEN")  # the Qwen2 backbone's config and tokenizer
    precision = "fp16" if cosy.fp16 else "fp32"
    if cosy.load_jit:
        encoders = ("llm.text_encoder", "llm.llm", "flow.encoder") if version == 1 else ("flow.encoder",)
        files += [f"{name}.{precision}.zip" for name in encoders]
    if cosy.load_trt:
        files.append("flow.decoder.estimator.fp32.onnx")  # the .plan is built from it when missing
    return files


def check_model_dir(cosy: CosyVoiceConfig) -> int:
    """Everything the constructor will open exists; returns the version. Runs before any import."""
    version = model_version(cosy.model_dir)
    missing = [name for name in required_files(version, cosy) if not (Path(cosy.model_dir) / name).exists()]
    if missing:
        raise ConfigError(f"CosyVoice model directory {cosy.model_dir} lacks {', '.join(missing)}")
    return version


def import_model_modules(model_dir: str, version: int, standins: bool = True) -> None:
    """Import the modules a model directory's yaml names, as its constructor would.

    A slot's forkserver does this once, so that every forked worker finds them imported: Matcha-TTS's
    flow decoder alone brings diffusers, torch._dynamo and lightning (2 s on 2 cores, alone). A name
    that does not import is left to the worker's own load, which says why.
    """
    text = (Path(model_dir) / VERSION_YAML[version]).read_text(encoding="utf-8")
    with held_back(version, standins):
        for dotted in sorted(set(re.findall(r"!(?:new|name|apply):([A-Za-z_][\w.]*)", text))):
            _import_longest_prefix(dotted)


def _import_longest_prefix(dotted: str) -> None:
    """Import the longest importable module path in `dotted` (a.b.Class.method: a.b; a builtin: none)."""
    parts = dotted.split(".")
    for end in range(len(parts) - 1, 0, -1):
        try:
            importlib.import_module(".".join(parts[:end]))
            return
        except ImportError:
            continue


def constructor_kwargs(cls, cosy: CosyVoiceConfig) -> dict:
    """The load options this class accepts; options it lacks are dropped with a warning if set."""
    params = inspect.signature(cls.__init__).parameters
    kwargs = {name: getattr(cosy, name) for name in LOAD_OPTIONS if name in params}
    dropped = [name for name in LOAD_OPTIONS if name not in params and getattr(cosy, name)]
    if dropped:
        log.warning("%s takes no %s; ignored", cls.__name__, ", ".join(dropped))
    if "final" in params:
        # cosyvoice2-eu's CosyVoice2 opens llm-original.pt etc. unless final=True; the official
        # file names (llm.pt, flow.pt, hift.pt) are what final=True loads.
        kwargs["final"] = True
    return kwargs


def load_model(cosy: CosyVoiceConfig, clock: LoadClock | None = None, device: str | None = None):
    """Construct the upstream model object for `cosy.model_dir` (CosyVoice, CosyVoice2 or CosyVoice3).

    `clock` gets the seconds of each phase: imports, modules, frontend, weights (convtts.speak.cosyvoice.loading).
    `device`: the GPU the model will run on, where a v1 model's modules are built (upstream builds
    them on the CPU and moves them after loading the weights); None: the CPU.
    """
    clock = clock or LoadClock()
    # Checked before the import and before the constructor: upstream calls ModelScope's
    # snapshot_download for any model_dir that does not exist.
    version = check_model_dir(cosy)
    clock.modules_on = device if version == 1 else None
    clock.map_weights = cosy.map_weights
    with clock.phase(IMPORTS):
        module = import_runtime(cosy, version)
    cls = getattr(module, CLASS_NAME[version], None)
    if cls is None:
        raise ConfigError(
            f"the CosyVoice runtime at {_origin(module)} has no {CLASS_NAME[version]} class for "
            f"{VERSION_YAML[version]}; point tts.cosyvoice.runtime_root at an official checkout"
        )
    # ModelScope reads no offline variable: take its downloader away from the upstream module.
    module.snapshot_download = refuse_download
    upstream_patches.quiet_progress(module)
    upstream_patches.share_text_normalizers()
    upstream_patches.forget_mel_filters()
    if version >= 2:
        resolve_placeholders()  # a v1 load in this process left them
        upstream_patches.load_backbone_in_fp32()
        upstream_patches.decode_steps_see_the_whole_cache()
        upstream_patches.read_prompts_with_soundfile()
    time_upstream_steps(module)
    lazy_onnx_sessions(sys.modules.get("cosyvoice.cli.frontend"))
    model_dir = str(Path(cosy.model_dir).resolve())
    # the modules the yaml names are imported here (Matcha-TTS's decoder brings diffusers)
    with fast_load(clock), held_back(version, cosy.standins):
        model = cls(model_dir, **constructor_kwargs(cls, cosy))
    log.info("loaded %s %s with the runtime from %s", CLASS_NAME[version], model_dir, _origin(sys.modules["cosyvoice"]))
    return model
