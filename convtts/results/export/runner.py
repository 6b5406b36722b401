"""One export run: each unit of the plan written to bounded parts, skipped when already exported as it is.

Resume contract (the same order of writes as synthesis): a part is written under a hidden temporary
name and renamed into place when whole; a unit enters the state only when all its parts are in
place, as a line appended to .export-state.jsonl; .export-state.json, the state as a whole, is
written at the start and the end of an export, which then removes the lines. A rerun skips the
units whose manifest lines and options match the state, redoes the rest, and at the end removes
files no unit owns (parts of an older version).
"""

from __future__ import annotations

import fcntl
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
from tqdm import tqdm

from convtts.results.export.formats import FORMATS, Format, get_format
from convtts.results.export.source import SourceError, Unit, check_source, export_fields, read_units
from convtts.results.report import iter_jsonl
from convtts.state.layout import Layout
from convtts.state.shardio import append_line, read_json, write_json_atomic

STATE_NAME = ".export-state.json"
JOURNAL_NAME = ".export-state.jsonl"  # {"unit": name, "entry": {...}, or null: its files are being replaced}
STATE_VERSION = 1


class ExportLocked(RuntimeError):
    """Another export is writing the same destination."""


@dataclass(frozen=True)
class ExportOptions:
    format: str
    dest: Path
    shard_rows: int = 5000
    shard_mb: float = 500.0

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"unknown format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if self.shard_rows < 1:
            raise ValueError("--shard-rows must be at least 1")
        if not self.shard_mb > 0:
            raise ValueError("--shard-mb must be above 0")

    def key(self, source: Path) -> str:
        """What the files depend on besides the rows: a change redoes every unit."""
        return orjson.dumps(
            {
                "version": STATE_VERSION,
                "format": self.format,
                "shard_rows": self.shard_rows,
                "shard_mb": self.shard_mb,
                "source": str(source.resolve()),
            }
        ).decode()


@dataclass
class Result:
    rows: int = 0
    units: int = 0
    written_units: int = 0
    skipped_units: int = 0
    files: int = 0
    seconds: float = 0.0
    not_spoken: int = 0  # segments the output lacks (failed or pending), from its summary


def export(layout: Layout, options: ExportOptions) -> Result:
    check_source(layout)
    fmt = get_format(options.format)
    options.dest.mkdir(parents=True, exist_ok=True)
    with _locked(options.dest):
        return _export_locked(layout, options, fmt)


def _export_locked(layout: Layout, options: ExportOptions, fmt: Format) -> Result:
    started = time.time()
    remove_temporaries(options.dest)
    key = options.key(layout.root)
    state = load_state(options.dest)
    state["finished"] = False
    save_state(options.dest, state)
    result = Result()
    seen: set[str] = set()
    summary = read_json(layout.summary_file) or {}
    result.not_spoken = (summary.get("failed") or 0) + (summary.get("pending") or 0)
    bar = tqdm(
        total=summary.get("done"),
        unit="rows",
        desc=f"export {options.format}",
        disable=not sys.stderr.isatty(),
        dynamic_ncols=True,
    )
    with bar:
        for unit in read_units(layout, options.shard_rows):
            fingerprint = unit.fingerprint(key)
            if _is_current(state, options.dest, unit.name, fingerprint):
                result.skipped_units += 1
                bar.update(len(unit.lines))
            else:
                if state["units"].pop(unit.name, None):  # its files are about to be replaced: not current now
                    note(options.dest, unit.name, None)
                files = write_unit(layout, options, fmt, unit, bar.update)
                state["units"][unit.name] = {"fingerprint": fingerprint, "rows": len(unit.lines), "files": files}
                note(options.dest, unit.name, state["units"][unit.name])
                result.written_units += 1
            seen.add(unit.name)
            result.units += 1
            result.rows += len(unit.lines)
    for name in set(state["units"]) - seen:  # units of an older plan: their files go as unowned below
        del state["units"][name]
    fmt.finish(options.dest, _all_files(state))
    remove_unowned(options.dest, fmt, _all_files(state))
    state["finished"] = True
    state["rows"] = result.rows
    save_state(options.dest, state)
    result.files = len(_all_files(state))
    result.seconds = time.time() - started
    return result


def write_unit(
    layout: Layout, options: ExportOptions, fmt: Format, unit: Unit, progress=lambda rows: None
) -> list[str]:
    """Write one unit's rows into parts of at most shard_rows rows and about shard_mb of audio each."""
    limit = options.shard_mb * 1e6
    files: list[str] = []
    part = None
    number = 0
    try:
        for row in unit.rows():
            if part is not None and (part.rows >= options.shard_rows or part.bytes >= limit):
                files += part.commit()
                part = None
            if part is None:
                part = fmt.open_part(options.dest, unit.name, number)
                number += 1
            audio = layout.root / row["audio"]
            part.add(export_fields(row), audio, _read_audio(audio) if fmt.embeds_audio else _check_audio(audio))
            progress(1)
        if part is not None:
            files += part.commit()
    except BaseException:
        if part is not None:
            part.discard()
        raise
    return files


def _read_audio(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise SourceError(
            f"audio file missing: {path} (the manifest lists it); run run_all.sh on the output again"
        ) from None


def _check_audio(path: Path) -> None:
    if not path.is_file():
        raise SourceError(f"audio file missing: {path} (the manifest lists it); run run_all.sh on the output again")


def _is_current(state: dict, dest: Path, unit: str, fingerprint: str) -> bool:
    entry = state["units"].get(unit)
    return bool(entry) and entry["fingerprint"] == fingerprint and all((dest / f).is_file() for f in entry["files"])


def _all_files(state: dict) -> set[str]:
    return {f for entry in state["units"].values() for f in entry["files"]}


def load_state(dest: Path) -> dict:
    """The state as a whole, and the units its lines record since it was written."""
    state = read_json(dest / STATE_NAME)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION or not isinstance(state.get("units"), dict):
        state = {"version": STATE_VERSION, "units": {}}
    for line in iter_jsonl(dest / JOURNAL_NAME):
        if isinstance(line, dict) and isinstance(line.get("unit"), str):
            if isinstance(line.get("entry"), dict):
                state["units"][line["unit"]] = line["entry"]
            else:
                state["units"].pop(line["unit"], None)
    return state


def save_state(dest: Path, state: dict) -> None:
    """The state whole, in place of the lines that led to it."""
    write_json_atomic(dest / STATE_NAME, state)
    (dest / JOURNAL_NAME).unlink(missing_ok=True)


def note(dest: Path, unit: str, entry: dict | None) -> None:
    """One unit's entry (None: its files are being replaced), appended: a line, not the whole state."""
    append_line(dest / JOURNAL_NAME, {"unit": unit, "entry": entry})


def remove_temporaries(dest: Path) -> None:
    """What a killed export left: hidden temporary parts. The lock says no other export is writing.

    Only the folders the formats write are searched: --dest may be a folder that holds other things.
    """
    for folder in (dest, dest / "data", dest / "parts"):
        for path in folder.glob(".*.tmp"):
            path.unlink(missing_ok=True)


def remove_unowned(dest: Path, fmt: Format, owned: set[str]) -> None:
    for path in fmt.part_files(dest):
        if str(path.relative_to(dest)) not in owned:
            path.unlink()


class _locked:
    def __init__(self, dest: Path):
        self.path = dest / ".export.lock"

    def __enter__(self):
        self.fh = open(self.path, "a")
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise ExportLocked(f"another export is writing {self.path.parent}") from None
        return self

    def __exit__(self, *exc):
        self.fh.close()
