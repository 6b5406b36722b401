"""What every export format provides, and the table of formats by name."""

from __future__ import annotations

import importlib
import os
from pathlib import Path


class Part:
    """One output file set being written: hidden temporary names until commit renames them into place."""

    def __init__(self, dest: Path, names: list[str]):
        self.dest = dest
        self.names = names
        self.finals = [dest / name for name in names]
        for final in self.finals:
            final.parent.mkdir(parents=True, exist_ok=True)
        self.tmps = [final.with_name(f".{final.name}.tmp") for final in self.finals]
        self.rows = 0
        self.bytes = 0

    def add(self, fields: dict, audio: Path, data: bytes | None) -> None:
        self.write(fields, audio, data)
        self.rows += 1
        self.bytes += len(data) if data else 0

    def write(self, fields: dict, audio: Path, data: bytes | None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def commit(self) -> list[str]:
        """Close, make the data durable, then rename: a kill before this leaves only hidden temporaries."""
        self.close()
        for tmp, final in zip(self.tmps, self.finals):
            _fsync(tmp)
            os.replace(tmp, final)
        return self.names

    def discard(self) -> None:
        """A failed write (a full disk): leave no temporary file behind."""
        try:
            self.close()
        except Exception:
            pass  # the close failed the same way; the files go anyway
        for tmp in self.tmps:
            tmp.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Format:
    name = ""
    embeds_audio = False  # True: the audio bytes go into the export; False: it points at the output's files

    def open_part(self, dest: Path, unit: str, number: int) -> Part:
        raise NotImplementedError

    def part_files(self, dest: Path) -> list[Path]:
        """Every file of this format's naming under dest, for removing those no unit owns."""
        raise NotImplementedError

    def finish(self, dest: Path, files: set[str]) -> None:
        """After all units: whole-dataset files made from the parts (lhotse, NeMo)."""


# name -> module and class; a format's module is imported only when it is chosen, so that one
# format's library (pyarrow for hf) is not needed to export another.
FORMATS = {
    "hf": ("convtts.results.export.hf", "HuggingFace"),
    "lhotse": ("convtts.results.export.lhotse_format", "Lhotse"),
    "webdataset": ("convtts.results.export.webdataset_format", "WebDataset"),
    "nemo": ("convtts.results.export.nemo", "NeMo"),
}


class MissingLibrary(RuntimeError):
    """The chosen format needs a package that is not installed."""


def get_format(name: str) -> Format:
    module_name, class_name = FORMATS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MissingLibrary(
            f"the {name} export needs {exc.name}: pip install {exc.name} "
            "(or, in the convtts checkout, pip install '.[export]')"
        ) from None
    return getattr(module, class_name)()
