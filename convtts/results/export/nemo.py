"""NeMo: a JSON-lines manifest (audio_filepath, duration, text, orig_sample_rate; the other fields as extra keys).

The audio stays where the output has it; audio_filepath is absolute, so the manifest works from any
directory. Parts are parts/manifest-<unit>-<part>.json; manifest.json is all of them, made last.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from convtts.results.export.formats import Format, Part


class NeMo(Format):
    name = "nemo"

    def open_part(self, dest: Path, unit: str, number: int) -> Part:
        return LinesPart(dest, [f"parts/manifest-{unit}-{number:03d}.json"], nemo_line)

    def part_files(self, dest: Path) -> list[Path]:
        return sorted((dest / "parts").glob("manifest-*.json"))

    def finish(self, dest: Path, files: set[str]) -> None:
        concatenate(dest, sorted(files), dest / "manifest.json")


def nemo_line(fields: dict, audio: Path) -> list[bytes]:
    row = {
        "audio_filepath": str(audio.resolve()),
        "duration": fields["duration"],
        "text": fields["text"],
        "orig_sample_rate": fields["sample_rate"],
    }  # NeMo's own key for the file's rate
    row.update((key, value) for key, value in fields.items() if key not in row and key != "audio")
    return [orjson.dumps(row) + b"\n"]


class LinesPart(Part):
    """Parts of JSON lines, one file per name; `make` turns a row into one line per file."""

    def __init__(self, dest: Path, names: list[str], make, opener=open):
        super().__init__(dest, names)
        self.make = make
        self.files = [opener(tmp, "wb") for tmp in self.tmps]

    def write(self, fields: dict, audio: Path, data: bytes | None) -> None:
        for fh, line in zip(self.files, self.make(fields, audio)):
            fh.write(line)

    def close(self) -> None:
        for fh in self.files:
            fh.close()


def concatenate(dest: Path, names: list[str], target: Path) -> None:
    """target = the named parts one after another (gzip members join into one valid gzip file)."""
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as out:
        for name in names:
            with open(dest / name, "rb") as part:
                while chunk := part.read(1 << 20):
                    out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, target)
