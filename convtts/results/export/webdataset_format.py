"""WebDataset: tar shards of <key>.wav (or .flac), <key>.json (the manifest fields) and <key>.txt (the text).

WebDataset groups a tar's members into samples by the part of the name before its first dot, and our
ids may hold dots (safe ids allow [A-Za-z0-9._-]). The key is the id with each dot written %2E: ids
never hold %, so the key maps back to one id, and the .json carries the id as it is.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import orjson

from convtts.results.export.formats import Format, Part


def sample_key(uid: str) -> str:
    return uid.replace(".", "%2E")


class WebDataset(Format):
    name = "webdataset"
    embeds_audio = True

    def open_part(self, dest: Path, unit: str, number: int) -> Part:
        return TarPart(dest, [f"shard-{unit}-{number:03d}.tar"])

    def part_files(self, dest: Path) -> list[Path]:
        return sorted(dest.glob("shard-*.tar"))


class TarPart(Part):
    def __init__(self, dest: Path, names: list[str]):
        super().__init__(dest, names)
        self.tar = tarfile.open(self.tmps[0], "w", format=tarfile.PAX_FORMAT)

    def write(self, fields: dict, audio: Path, data: bytes | None) -> None:
        key = sample_key(fields["id"])
        self._member(f"{key}{audio.suffix.lower()}", data)
        self._member(f"{key}.json", orjson.dumps(fields))
        self._member(f"{key}.txt", fields["text"].encode())

    def _member(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        self.tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self.tar.close()
