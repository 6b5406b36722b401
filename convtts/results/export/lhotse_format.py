"""lhotse: recordings, supervisions and cuts as JSON-lines gzip, in lhotse's own dict layout.

One recording, one supervision and one cut per segment, all named by the segment id; the supervision
carries the text and speaker, and the other fields under `custom`. The audio stays where the output
has it (absolute paths). Parts are parts/<kind>-<unit>-<part>.jsonl.gz; <kind>.jsonl.gz is all of
them, made last, for lhotse.load_manifest_lazy.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from convtts.results.export.formats import Format, Part
from convtts.results.export.nemo import LinesPart, concatenate
from convtts.state.rows import LHOTSE_CUSTOM

KINDS = ("recordings", "supervisions", "cuts")
CUSTOM = LHOTSE_CUSTOM


def lhotse_lines(fields: dict, audio: Path) -> list[bytes]:
    uid, duration = fields["id"], fields["duration"]
    recording = {
        "id": uid,
        "sources": [{"type": "file", "channels": [0], "source": str(audio.resolve())}],
        "sampling_rate": fields["sample_rate"],
        "num_samples": fields["num_samples"],
        "duration": duration,
        "channel_ids": [0],
    }
    supervision = {
        "id": uid,
        "recording_id": uid,
        "start": 0.0,
        "duration": duration,
        "channel": 0,
        "text": fields["text"],
        "speaker": fields["speaker"],
        "language": fields.get("language"),
        "custom": {key: fields[key] for key in CUSTOM if fields.get(key) is not None},
    }
    cut = {
        "id": uid,
        "start": 0.0,
        "duration": duration,
        "channel": 0,
        "supervisions": [supervision],
        "recording": recording,
        "type": "MonoCut",
    }
    return [orjson.dumps(item) + b"\n" for item in (recording, supervision, cut)]


def _gzip_open(path, mode):
    return gzip.open(path, mode, compresslevel=5)


class Lhotse(Format):
    name = "lhotse"

    def open_part(self, dest: Path, unit: str, number: int) -> Part:
        names = [f"parts/{kind}-{unit}-{number:03d}.jsonl.gz" for kind in KINDS]
        return LinesPart(dest, names, lhotse_lines, opener=_gzip_open)

    def part_files(self, dest: Path) -> list[Path]:
        return sorted(p for kind in KINDS for p in (dest / "parts").glob(f"{kind}-*.jsonl.gz"))

    def finish(self, dest: Path, files: set[str]) -> None:
        for kind in KINDS:
            concatenate(dest, sorted(f for f in files if f.startswith(f"parts/{kind}-")), dest / f"{kind}.jsonl.gz")
