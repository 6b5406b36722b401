"""What every export format provides, and the table of formats by name."""
from __future__ import annotations

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


def _formats() -> dict[str, Format]:
    from convtts.export.hf import HuggingFace
    from convtts.export.lhotse_format import Lhotse
    from convtts.export.nemo import NeMo
    from convtts.export.webdataset_format import WebDataset

    return {fmt.name: fmt for fmt in (HuggingFace(), Lhotse(), WebDataset(), NeMo())}


FORMATS = _formats()
