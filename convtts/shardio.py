"""Reading and appending the per-shard JSON-lines files, tolerant of a half-written last line."""
from __future__ import annotations

import errno
import os
from collections import Counter
from pathlib import Path

import orjson

from convtts.layout import Layout


def read_jsonl(path: Path) -> list[dict]:
    """All complete lines of a JSON-lines file; a torn last line (a kill mid-write) is ignored."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    rows = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue  # only a torn tail can be invalid: we write whole lines in one call
    return rows


def drop_torn_tail(path: Path) -> None:
    """Cut a file back to its last newline so the next append starts on a fresh line."""
    try:
        with open(path, "rb+") as fh:
            data = fh.read()
            if data and not data.endswith(b"\n"):
                fh.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


def append_line(path: Path, row: dict) -> None:
    """Append one JSON line in a single write, so a kill leaves at most a torn tail.

    A write that fails part way (a full disk) is cut back off: the file keeps whole lines only.
    That is safe because each file has one writer.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            _write_all(fd, orjson.dumps(row) + b"\n")
        except OSError as exc:
            os.ftruncate(fd, start)  # frees space rather than needing it
            raise _naming(exc, path)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: Path, data: bytes) -> None:
    """Write under a hidden temporary name, then rename into place: a kill or a full disk never
    leaves half a file under the real name, and a failed write leaves no temporary file either."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise _naming(exc, path) if isinstance(exc, OSError) else exc


def write_json_atomic(path: Path, value) -> None:
    write_atomic(path, orjson.dumps(value, option=orjson.OPT_INDENT_2))


def is_disk_full(exc: BaseException) -> bool:
    """No space or over quota: the output filesystem's fault, never an utterance's."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_text(exc: OSError) -> str:
    return f"{exc.strerror or 'no space left on device'} writing {exc.filename or 'a file'}"


def _naming(exc: OSError, path: Path) -> OSError:
    """A failed os.write or buffered write does not say which file: name it for the log."""
    if exc.filename is None:
        exc.filename = str(path)
    return exc


def read_json(path: Path):
    try:
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def load_done(layout: Layout, shard: str) -> dict[str, dict]:
    """Manifest rows of a shard by id whose audio file is really there.

    The rows come from every writer's file; an id spoken twice (its worker died between the row and
    its report, and the id was spoken again) keeps its latest row, which matches the audio on disk.
    """
    done = latest_by_id(row for path in layout.manifests(shard) for row in read_jsonl(path))
    return {i: r for i, r in done.items() if (layout.root / r["audio"]).is_file()}


def load_failures(layout: Layout, shard: str) -> dict[str, dict]:
    """The latest failure row per id, from every writer's failures file of the shard."""
    return latest_by_id(row for path in layout.failure_files(shard) for row in read_jsonl(path))


def latest_by_id(rows) -> dict[str, dict]:
    """One row per id: the one finished last (`finished` on manifest rows, `time` on failure rows)."""
    latest: dict[str, dict] = {}
    for row in rows:
        uid = row.get("id")
        if uid is not None and (uid not in latest or _when(row) >= _when(latest[uid])):
            latest[uid] = row
    return latest


def _when(row: dict) -> float:
    return row.get("finished") or row.get("time") or 0.0


def crash_counts(layout: Layout, shard: str, run_id: str) -> Counter:
    """How often a worker died on each utterance during this run."""
    return Counter(r["id"] for r in read_jsonl(layout.crashes(shard)) if r.get("run") == run_id)


def shard_complete(layout: Layout, shard: str) -> bool:
    """A shard is finished when its stats file, written last, says nothing failed."""
    stats = read_json(layout.stats(shard))
    return bool(stats) and stats.get("failed", 1) == 0 and stats.get("pending", 1) == 0
