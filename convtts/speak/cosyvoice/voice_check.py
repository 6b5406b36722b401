"""The CosyVoice voice's check before any worker starts: the runtime is there, the model's files, and
every configured voice can be spoken by it. Apart from backend.py because the check runs in the
node's own process, which never loads a model: reading the model's speaker table here imports no torch.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from pathlib import Path

from convtts.config import Config, ConfigError
from convtts.speak.cosyvoice.prompts import check_pool, check_prompts
from convtts.speak.cosyvoice.runtime import check_model_dir, check_runtime


def builtin_speakers(model_dir: str) -> list[str]:
    """Keys of the model's own spk2info.pt (v1 SFT speakers); [] if it has none."""
    path = Path(model_dir) / "spk2info.pt"
    if not path.is_file():
        return []
    names = table_keys(path)
    if names is not None:
        return names
    import torch  # an older or unusual file: let torch read it, and say what is wrong with it

    try:
        info = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a corrupt or foreign file: say which one
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(info, dict):
        raise ConfigError(f"{path} does not hold a speaker table")
    return [str(name) for name in info]


class _TableKeys(pickle.Unpickler):
    """Unpickles torch.save's data.pkl with every tensor left out: the table's keys, without torch.

    Importing torch cost 3 to 5 s of every run's up-front check on a GPU node, for these names.
    Only torch's own rebuild functions and plain containers are allowed, as torch's weights_only does.
    """

    def find_class(self, module, name):
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module.split(".")[0] == "torch":
            return _nothing
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a speaker table")

    def persistent_load(self, pid):
        return None


def _nothing(*args, **kwargs):
    return None


def table_keys(path: Path) -> list[str] | None:
    """The keys of a dict saved by torch.save (its zip format), or None where this cannot tell."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
            table = _TableKeys(io.BytesIO(archive.read(name))).load() if name else None
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
        return None
    return [str(key) for key in table] if isinstance(table, dict) else None


def check(config: Config) -> None:
    """Fail before any worker starts: runtime, model files, and that every voice can be spoken."""
    cosy = config.tts.cosyvoice
    check_runtime(cosy)
    version = check_model_dir(cosy)
    if config.speakers.pool:
        check_pool(config.speakers.pool, version)
        return
    voices = list(config.speakers.voices)
    check_prompts(cosy, [v for v in voices if v in cosy.prompts], version)
    told = [cosy.prompts[v].speaker for v in voices if v in cosy.prompts and cosy.prompts[v].speaker]
    builtin = [v for v in voices if v not in cosy.prompts] + told
    if not builtin:
        return
    if version >= 2:
        raise ConfigError(
            f"speakers.voices {builtin} need prompts: a CosyVoice{version} model has no built-in "
            "speakers, define each voice in tts.cosyvoice.prompts (audio, text), or give speakers.pool"
        )
    known = builtin_speakers(cosy.model_dir)
    unknown = [v for v in builtin if v not in known]
    if unknown:
        raise ConfigError(
            f"speakers.voices {unknown} are not speakers of {cosy.model_dir}; its spk2info.pt holds "
            f"{known or 'none'} (or define them as zero-shot voices in tts.cosyvoice.prompts)"
        )
