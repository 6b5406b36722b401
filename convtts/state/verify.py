"""Checks of a finished output directory: every planned id spoken once, audio that decodes, no leftovers."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from pathlib import Path

import soundfile as sf

from convtts.state.layout import Layout
from convtts.state.shardio import DROPPED, read_jsonl


def check_complete(out: str | Path, processes: int = 1) -> list[str]:
    """What is wrong with a finished output, one line per problem; empty when every id is there once.

    Checks: manifest.jsonl holds each planned id exactly once, but for ids failures.jsonl records as
    dropped (validate.on_fail: drop); each row's audio file decodes to num_samples frames at
    sample_rate and lasts `duration`; audio/ holds no file the manifest lacks. `processes` > 1
    decodes the audio in that many processes (a node's output of 100,000 files: a minute on one core).
    """
    layout = Layout(out)
    if not layout.manifest_file.is_file():
        return [f"no {layout.manifest_file}"]
    rows = read_jsonl(layout.manifest_file)
    counts = Counter(r.get("id") for r in rows)
    problems = [f"{uid} appears {n} times in the manifest" for uid, n in counts.items() if n > 1]
    dropped = {r.get("id") for r in read_jsonl(layout.failures_file) if r.get("status") == DROPPED}
    planned = set(planned_ids(layout))
    problems += [f"{uid} is both dropped and in the manifest" for uid in sorted(dropped & set(counts))]
    problems += [f"{uid} planned but not in the manifest" for uid in sorted(planned - dropped - set(counts))]
    problems += [f"{uid} in the manifest but not planned" for uid in sorted(set(counts) - planned)]
    problems += all_audio_problems(layout.root, rows, processes)
    on_disk = {str(p.relative_to(layout.root)) for p in layout.audio_root.rglob("*") if p.is_file()}
    problems += [f"audio file {p} has no manifest row" for p in sorted(on_disk - {r.get("audio") for r in rows})]
    return problems


def planned_ids(layout: Layout) -> list[str]:
    return [row["id"] for shard in layout.shard_names() for row in read_jsonl(layout.shard_file(shard))]


def all_audio_problems(root: Path, rows: list[dict], processes: int = 1) -> list[str]:
    if processes <= 1 or len(rows) < 2:
        return [problem for row in rows for problem in audio_problems(root, row)]
    with multiprocessing.get_context("spawn").Pool(min(processes, len(rows))) as pool:
        found = pool.starmap(audio_problems, ((root, row) for row in rows), chunksize=256)
    return [problem for problems in found for problem in problems]


def audio_problems(root: Path, row: dict) -> list[str]:
    """A manifest row's audio: there, decodable, and as long as the row says."""
    path = root / row["audio"]
    try:
        info = sf.info(path)
        data, _ = sf.read(path)
    except (OSError, RuntimeError) as exc:  # soundfile raises LibsndfileError, a RuntimeError
        return [f"{row['id']}: audio {row['audio']} does not decode: {exc}"]
    problems = []
    if not info.frames == row["num_samples"] == len(data) > 0:
        problems.append(
            f"{row['id']}: {info.frames} frames on disk, {len(data)} decoded, row says {row['num_samples']}"
        )
    if info.samplerate != row["sample_rate"]:
        problems.append(f"{row['id']}: sample rate {info.samplerate} on disk, row says {row['sample_rate']}")
    if abs(info.duration - row["duration"]) >= 1e-3:
        problems.append(f"{row['id']}: lasts {info.duration:.4f} s on disk, row says {row['duration']}")
    return problems


def temporary_files(out: str | Path) -> list[str]:
    """Leftovers of interrupted writes anywhere under the output: `.tmp` names, `.rewrite` files, plan staging.

    A finished run must have renamed or removed all of them, e.g. audio/shard-00003/.c1-001-00.tmp4242.wav,
    work/.shard-00003.stats.json.tmp4242, work/shard-00003.manifest.jsonl.rewrite, .plan-new-4242/.
    """
    root = Path(out)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if _is_temporary(p.name))


def _is_temporary(name: str) -> bool:
    return (
        (name.startswith(".") and ".tmp" in name)
        or name.endswith(".rewrite")
        or name.startswith((".plan-new-", ".plan-old-"))
    )
