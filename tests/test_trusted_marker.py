"""A finished shard is trusted by its done marker's sizes; --verify opens every audio file.

One real run is made per module and copied for each test; each test damages the copy, runs the
same command again (with --verify where it says), and checks what was spoken again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from conftest import SMALL_JOB_ARGS as ARGS
from conftest import SMALL_JOB_ENV as ENV
from conftest import assert_complete, llava_conversations, read_jsonl, run_all, script_env, write_input
from convtts.state.marker import FACTS

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("finished")
    source = write_input(root / "convs.json", llava_conversations(4))
    done = run_all("--input", source, "--output-dir", root / "out", *ARGS, env=script_env(**ENV))
    assert done.returncode == 0, done.stderr
    return source, root / "out", {row["id"]: row for row in assert_complete(root / "out")}


@pytest.fixture
def copy(finished, tmp_path):
    source, out, rows = finished
    shutil.copytree(out, tmp_path / "out")
    return source, tmp_path / "out", rows


def rerun(source: Path, out: Path, log: Path, *extra: str):
    """The same command again (and `extra`): its exit code, the work rows by id, every line it logged."""
    again = run_all("--input", source, "--output-dir", out, "--log-dir", log, *ARGS, *extra, env=script_env(**ENV))
    rows = [row for path in sorted((out / "work").glob("*.manifest.jsonl")) for row in read_jsonl(path)]
    lines = [line for path in sorted(log.rglob("*.log")) for line in path.read_text().splitlines()]
    latest = {}
    for row in sorted(rows, key=lambda r: r["finished"]):
        latest[row["id"]] = row
    return again.returncode, latest, lines


def redone(before: dict[str, dict], after: dict[str, dict]) -> set[str]:
    return {uid for uid in after if after[uid]["run"] != before[uid]["run"]}


def victim(out: Path) -> dict:
    return read_jsonl(sorted((out / "work").glob("shard-00001*.manifest.jsonl"))[0])[1]


def said(lines: list[str], *words: str) -> bool:
    return any(all(word in line for word in words) for line in lines)


def test_markers_record_the_sizes_on_disk(finished):
    _, out, rows = finished
    for stats in sorted((out / "work").glob("shard-*.stats.json")):
        facts = orjson.loads(stats.read_bytes())[FACTS]
        shard = stats.name.split(".")[0]
        planned = read_jsonl(out / "plan" / "shards" / f"{shard}.jsonl")
        assert facts["rows"] == len(planned) > 0
        audio = out / "audio" / shard
        assert facts["audio"] == {p.name: p.stat().st_size for p in audio.iterdir()}
        assert sorted(
            Path(r["audio"]).name for r in rows.values() if r["audio"].startswith(f"audio/{shard}/")
        ) == sorted(facts["audio"])
        for name, size in facts["manifests"].items():
            assert (out / "work" / name).stat().st_size == size


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_the_default_rerun_finds_a_changed_size_and_speaks_it_again(copy, tmp_path, damage):
    source, out, before = copy
    row = victim(out)
    audio = out / row["audio"]
    data = audio.read_bytes()
    if damage == "deleted":
        audio.unlink()
    else:
        audio.write_bytes(data[: len(data) // 2])

    code, after, log = rerun(source, out, tmp_path / "log")
    assert code == 0
    assert redone(before, after) == {row["id"]}
    change = "is gone" if damage == "deleted" else f"was {len(data)} bytes, is {len(data) // 2}"
    assert said(log, "shard-00001: its audio changed", audio.name, change)
    assert audio.read_bytes() == data  # the tone voice is deterministic: the same audio again


def test_damage_that_keeps_the_size_is_found_by_verify(copy, tmp_path):
    source, out, before = copy
    row = victim(out)
    audio = out / row["audio"]
    data = audio.read_bytes()
    audio.write_bytes(b"XXXX" + data[4:])  # the header overwritten in place: the same size, no WAV

    saved = tmp_path / "damaged"
    shutil.copytree(out, saved)
    code, trusted, log = rerun(source, out, tmp_path / "log")
    assert redone(before, trusted) == set()  # the marker's sizes hold: the slot did not open the audio
    assert audio.read_bytes()[:4] == b"XXXX"
    # the merge, which reads every changed file, finds it: exit 1, and the shard's marker withdrawn,
    # so the plain rerun its closing line asks for speaks it again
    assert code == 1 and not (out / "work" / "shard-00001.stats.json").exists()
    code, after, _ = rerun(source, out, tmp_path / "log-again")
    assert code == 0 and redone(before, after) == {row["id"]} and audio.read_bytes() == data

    shutil.rmtree(out)
    saved.rename(out)
    code, after, log = rerun(source, out, tmp_path / "log-verify", "--verify")
    assert code == 0
    assert redone(before, after) == {row["id"]}
    assert said(log, row["id"], str(audio), "does not decode", "spoken again")
    assert audio.read_bytes() == data


def test_a_marker_without_facts_is_checked_in_full_once_and_given_them(copy, tmp_path):
    source, out, before = copy
    stats = out / "work" / "shard-00000.stats.json"
    marker = orjson.loads(stats.read_bytes())
    recorded = marker.pop(FACTS)
    stats.write_bytes(orjson.dumps(marker))  # as an earlier version wrote it

    code, after, _ = rerun(source, out, tmp_path / "log")
    assert code == 0 and redone(before, after) == set()
    assert orjson.loads(stats.read_bytes())[FACTS] == recorded
