"""A manifest row's fields for training, in one place: which the plan gives each row, and the type
each export writes them in. The manifest writer (run/utterance.py) and every export read this table;
the rest of a row (status, attempts, worker, pid, memory, timings) describes the run, not the data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # string | int32 | int64 | float64 (Hugging Face datasets dtypes), or audio (the file)
    planned: bool = False  # copied from the plan's segment row into the manifest row
    in_lhotse: bool = False  # lhotse's recording or supervision has a place of its own for it


FIELDS = (
    Field("id", "string", planned=True, in_lhotse=True),
    Field("conversation_id", "string", planned=True),
    Field("source_id", "string", planned=True),  # the input record's own id, as it was written
    Field("turn", "int32", planned=True),
    Field("segment", "int32", planned=True),
    Field("role", "string", planned=True),
    Field("side", "string", planned=True),
    Field("speaker", "string", planned=True, in_lhotse=True),
    Field("language", "string", planned=True, in_lhotse=True),
    Field("text", "string", planned=True, in_lhotse=True),  # as spoken
    Field("source_text", "string", planned=True),  # the turn as written, on its first segment
    Field("duration", "float64", in_lhotse=True),
    Field("num_samples", "int64", in_lhotse=True),
    Field("sample_rate", "int32", in_lhotse=True),
    Field("backend", "string"),
    Field("seed", "int64"),
    Field("audio", "audio", in_lhotse=True),  # the file, relative to the output directory
    Field("prompt_audio", "string"),  # a zero-shot voice's recording (speaker is its name); null for other voices
)

PLANNED = tuple(field.name for field in FIELDS if field.planned)
EXPORTED = tuple(field.name for field in FIELDS)
LHOTSE_CUSTOM = tuple(field.name for field in FIELDS if not field.in_lhotse)  # a supervision's `custom`
KINDS = {field.name: field.kind for field in FIELDS}
