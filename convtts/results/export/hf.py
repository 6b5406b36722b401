"""Hugging Face datasets: parquet shards with an Audio column, loadable by datasets.load_dataset as they are.

The schema carries the `huggingface` metadata that datasets reads its features from, so `audio` is an
Audio feature (the file's bytes and name) with no loading script. One split, train: the files are
data/train-<unit>-<part>.parquet, which datasets' file-name patterns assign to it.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from convtts.results.export.formats import Format, Part
from convtts.state.rows import KINDS

ROWS_PER_GROUP = 100  # audio rows are large: small row groups let readers stream them

# The parquet columns beside the audio, in the order exports made before have them (parts of one
# dataset must agree); their types are the row schema's (convtts/state/rows.py).
ORDER = (
    "id", "text", "speaker", "language", "role", "side", "conversation_id", "source_id", "turn", "segment",
    "duration", "num_samples", "sample_rate", "source_text", "backend", "seed", "prompt_audio",
)  # fmt: skip
ARROW = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64()}
COLUMNS = [(name, ARROW[KINDS[name]], KINDS[name]) for name in ORDER]  # (name, arrow type, datasets dtype)
_TEXT_COLUMNS = [name for name, kind, _ in COLUMNS if kind == pa.string()]
AUDIO_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def schema() -> pa.Schema:
    features = {"audio": {"_type": "Audio"}}
    features.update({name: {"dtype": dtype, "_type": "Value"} for name, _, dtype in COLUMNS})
    fields = [pa.field("audio", AUDIO_TYPE)] + [pa.field(name, kind) for name, kind, _ in COLUMNS]
    return pa.schema(fields, metadata={"huggingface": orjson.dumps({"info": {"features": features}})})


class HuggingFace(Format):
    name = "hf"
    embeds_audio = True

    def __init__(self):
        self.schema = schema()

    def open_part(self, dest: Path, unit: str, number: int) -> Part:
        return ParquetPart(dest, [f"data/train-{unit}-{number:03d}.parquet"], self.schema)

    def part_files(self, dest: Path) -> list[Path]:
        return sorted((dest / "data").glob("train-*.parquet"))


class ParquetPart(Part):
    def __init__(self, dest: Path, names: list[str], arrow_schema: pa.Schema):
        super().__init__(dest, names)
        self.schema = arrow_schema
        # a dictionary of audio bytes only costs time: every clip is different
        self.writer = pq.ParquetWriter(
            self.tmps[0],
            arrow_schema,
            use_dictionary=[name for name, _, _ in COLUMNS],
            compression={"audio.bytes": "none", **{name: "snappy" for name, _, _ in COLUMNS}, "audio.path": "snappy"},
        )
        self.buffer: list[dict] = []

    def write(self, fields: dict, audio: Path, data: bytes | None) -> None:
        row = {name: fields.get(name) for name, _, _ in COLUMNS}
        for name in _TEXT_COLUMNS:  # an input's own id may be a number: "id": 17
            if row[name] is not None and not isinstance(row[name], str):
                row[name] = str(row[name])
        row["audio"] = {"bytes": data, "path": audio.name}
        self.buffer.append(row)
        if len(self.buffer) >= ROWS_PER_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.writer.write_table(pa.Table.from_pylist(self.buffer, schema=self.schema))
            self.buffer = []

    def close(self) -> None:
        self.flush()
        self.writer.close()
