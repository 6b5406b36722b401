"""Reading and appending the per-shard JSON-lines files, tolerant of a half-written last line."""

from __future__ import annotations

import errno
import logging
import os
from collections import Counter
from pathlib import Path

import orjson
import soundfile as sf

from convtts.state.layout import Layout, WorkListing
from convtts.state.marker import FACTS, facts_differ, facts_of

log = logging.getLogger(__name__)

# Statuses of manifest rows besides "ok", for utterances whose every take the quality gate refused
# (validate.on_fail): KEPT rows carry the last take's audio; a DROPPED row has none, and settles
# its id as surely as audio does: a rerun speaks it no more.
KEPT = "gate-refused-kept"
DROPPED = "dropped"


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


def read_rows_checked(path: Path) -> tuple[list[dict], list[int]]:
    """The rows of a work file (JSON objects with an id), and the numbers of the lines that are not.

    A kill leaves at most a torn last line; any other bad line is damage, which the caller reports.
    """
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return [], []
    rows, bad = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            row = None
        if isinstance(row, dict) and "id" in row:
            rows.append(row)
        else:
            bad.append(number)
    return rows, bad


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
    fd = in_folder(path, lambda: os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    try:
        start = os.fstat(fd).st_size
        try:
            _write_all(fd, orjson.dumps(row) + b"\n")
        except OSError as exc:
            os.ftruncate(fd, start)  # frees space rather than needing it
            _naming(exc, path)
            raise
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# What follows the pid in this process's temporary names: empty on one machine; a slot fed by the
# Ray driver gives its workers their host's tag, because pieces of one shard are then written from
# several nodes, whose pids may be the same (set once, at the start of the process).
_TEMPORARY_TAG = ""


def set_temporary_tag(tag: str) -> None:
    global _TEMPORARY_TAG
    _TEMPORARY_TAG = tag


def temporary_path(path: Path) -> Path:
    """The hidden name a file is written under before its rename: `.NAME.tmpPID` (plus the tag)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}{_TEMPORARY_TAG}")


def write_atomic(path: Path, data: bytes) -> None:
    """Write under a hidden temporary name, then rename into place: a kill or a full disk never
    leaves half a file under the real name, and a failed write leaves no temporary file either."""
    tmp = temporary_path(path)
    try:
        with in_folder(tmp, lambda: open(tmp, "wb")) as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            _naming(exc, path)
        raise


def in_folder(path: Path, create):
    """create() (which makes `path`), its folder made first where it has none: a thousand-shard
    folder's first file (Layout.fanned). The folder is made only then, not before every write."""
    try:
        return create()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return create()


def write_json_atomic(path: Path, value) -> None:
    write_atomic(path, orjson.dumps(value, option=orjson.OPT_INDENT_2))


def is_disk_full(exc: BaseException) -> bool:
    """No space or over quota: the output filesystem's fault, never an utterance's."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_text(exc: OSError) -> str:
    return f"{exc.strerror or 'no space left on device'} writing {exc.filename or 'a file'}"


def _naming(exc: OSError, path: Path) -> None:
    """A failed os.write or buffered write does not say which file: name it for the log."""
    if exc.filename is None:
        exc.filename = str(path)


def read_json(path: Path):
    try:
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def load_done(
    layout: Layout,
    shard: str,
    problems: list[str] | None = None,
    paths: list[Path] | None = None,
    check_audio: bool = True,
) -> dict[str, dict]:
    """Manifest rows of a shard by id whose audio is whole (audio_problem).

    The rows come from every writer's file (`paths`, else listed here); an id spoken twice (its
    worker died between the row and its report, and the id was spoken again) keeps its latest row,
    which matches the audio on disk. Lines that are not rows, and rows whose audio is not whole, are
    left out and said in `problems`. `check_audio` False trusts the rows (merge --no-audio-check).
    A DROPPED row has no audio to check.
    """
    rows = []
    for path in layout.manifests(shard) if paths is None else paths:
        good, bad = read_rows_checked(path)
        rows += good
        if problems is not None:
            problems += [f"{path} line {number} is not a manifest row; dropped" for number in bad]
    done = {}
    for uid, row in latest_by_id(rows).items():
        problem = audio_problem(layout, row) if check_audio and row.get("status") != DROPPED else None
        if problem is None:
            done[uid] = row
        elif problems is not None:
            problems.append(f"{uid}: {problem}; its row is dropped and it is spoken again")
    return done


def audio_problem(layout: Layout, row: dict) -> str | None:
    """Why a row's audio cannot count as spoken, or None when the file holds the frames the row says.

    Reading the last frame too catches a truncated FLAC, whose header still gives the full count.
    About 0.15 ms a file: every rerun checks every row of the shards it opens or finds marked done.
    """
    rel = row.get("audio")
    path = layout.root / rel if isinstance(rel, str) else None
    if path is None or not path.is_file():
        return f"audio {rel} is missing"
    try:
        with sf.SoundFile(path) as audio:
            if not audio.frames or audio.frames != row.get("num_samples"):
                return f"audio {path} has {audio.frames} frames, the row says {row.get('num_samples')}"
            audio.seek(audio.frames - 1)
            if len(audio.read(1)) != 1:
                return f"audio {path} ends before its last frame"
    except (OSError, RuntimeError) as exc:  # soundfile's LibsndfileError is a RuntimeError
        return f"audio {path} does not decode: {exc}"
    return None


def load_failures(layout: Layout, shard: str, paths: list[Path] | None = None) -> dict[str, dict]:
    """The latest failure row per id, from every writer's failures file of the shard (`paths`, else listed here)."""
    paths = layout.failure_files(shard) if paths is None else paths
    return latest_by_id(row for path in paths for row in read_jsonl(path))


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
    return _says_complete(read_json(layout.stats(shard)))


def _says_complete(stats) -> bool:
    return isinstance(stats, dict) and stats.get("failed", 1) == 0 and stats.get("pending", 1) == 0


def only_gate_refusals(layout: Layout, shard: str) -> bool:
    """Whether a shard was left unfinished by takes the quality gate refused (validate.on_fail: fail)
    and nothing else: nothing pending, and each id without a manifest row has a refusal (its `check`)
    as its latest failure."""
    stats = read_json(layout.stats(shard))
    if not isinstance(stats, dict) or stats.get("pending", 1):
        return False
    done = load_done(layout, shard, check_audio=False)
    failures = load_failures(layout, shard)
    unsettled = [row["id"] for row in read_jsonl(layout.shard_file(shard)) if row["id"] not in done]
    return all("check" in failures.get(uid, {}) for uid in unsettled)


def shard_complete_and_whole(
    layout: Layout, shard: str, listing: WorkListing | None = None, verify: bool = False
) -> bool:
    """shard_complete, and nothing since damaged. A marker with facts (state/marker.py) is trusted
    while every size it recorded is the same; otherwise, and with `verify`, every planned id must
    have a row whose audio is whole and no manifest line may be garbage, and the facts are then
    recorded (an older marker has none). A rerun opens any shard that fails this; the log says why.
    `listing`: work/ listed once for all the shards a caller checks (a glob each is quadratic)."""
    path = layout.stats(shard)
    stats = read_json(path)
    if stats is None and path.exists() or stats is not None and not isinstance(stats, dict):
        log.warning("%s: stats file %s does not parse; opening the shard again", shard, path)
        return False
    if not _says_complete(stats):
        return False
    manifests = listing.manifests(shard) if listing else layout.manifests(shard)
    facts = stats.get(FACTS)
    if isinstance(facts, dict) and not verify:
        change = facts_differ(layout, shard, facts, manifests)
        if change is None:
            return True
        log.info("%s: %s since it was marked done; checking its rows and audio", shard, change)
    ids = [row["id"] for row in read_jsonl(layout.shard_file(shard))]
    if not _all_whole(layout, shard, ids, manifests):
        return False
    if facts != facts_of(layout, shard, ids, manifests):
        write_marker(layout, shard, stats, manifests, ids)
    return True


def _all_whole(layout: Layout, shard: str, ids: list[str], manifests: list[Path]) -> bool:
    problems: list[str] = []
    done = load_done(layout, shard, problems, paths=manifests)
    missing = [uid for uid in ids if uid not in done]
    if missing or problems:
        log.warning(
            "%s was marked done, but %d of its utterances are not whole and %d problems were found "
            "(first: %s); opening it again",
            shard,
            len(missing),
            len(problems),
            problems[0] if problems else f"{missing[0]} has no manifest row",
        )
        return False
    return True


def write_marker(
    layout: Layout, shard: str, stats: dict, manifests: list[Path] | None = None, ids: list[str] | None = None
) -> None:
    """The shard's stats file, written last: its done marker. A finished shard's gets its facts
    (`manifests`: the shard's manifest files, else listed here; `ids`: its planned ids, else read)."""
    if _says_complete(stats):
        if ids is None:
            ids = [row["id"] for row in read_jsonl(layout.shard_file(shard))]
        manifests = layout.manifests(shard) if manifests is None else manifests
        stats = {**stats, FACTS: facts_of(layout, shard, ids, manifests)}
    write_json_atomic(layout.stats(shard), stats)
