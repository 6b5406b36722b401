"""Damage a finished output the ways disks and people do, rerun, and check the rerun repairs it.

One real run is made per module and copied for each test. Each test damages one thing, runs the
same command again, and checks: exit 0, a complete output, the damaged item redone (a row from
the new run) and nothing else redone, and a log line that names the file and says what was done.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from conftest import SMALL_JOB_ARGS as ARGS
from conftest import SMALL_JOB_ENV as ENV
from conftest import assert_complete, llava_conversations, read_jsonl, run_all, script_env, write_input
from convtts.state.verify import check_complete

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A complete output of two conversations (two shards), its input, and its manifest rows by id."""
    root = tmp_path_factory.mktemp("finished")
    source = write_input(root / "convs.json", llava_conversations(4))
    done = run_all(
        "--input", source, "--output-dir", root / "out", "--log-dir", root / "log", *ARGS, env=script_env(**ENV)
    )
    assert done.returncode == 0, done.stderr
    return source, root / "out", {row["id"]: row for row in assert_complete(root / "out")}


@pytest.fixture
def copy(finished, tmp_path):
    source, out, rows = finished
    shutil.copytree(out, tmp_path / "out")
    return source, tmp_path / "out", rows


def rerun(source: Path, out: Path, log: Path) -> tuple[dict[str, dict], list[str]]:
    """Run the same command again; return the manifest rows by id and every line the run logged."""
    again = run_all("--input", source, "--output-dir", out, "--log-dir", log, *ARGS, env=script_env(**ENV))
    assert again.returncode == 0, again.stderr
    lines = [line for path in sorted(log.rglob("*.log")) for line in path.read_text().splitlines()]
    return {row["id"]: row for row in assert_complete(out)}, lines


def redone(before: dict[str, dict], after: dict[str, dict]) -> set[str]:
    assert after.keys() == before.keys()
    return {uid for uid in after if after[uid]["run"] != before[uid]["run"]}


def work_manifest(out: Path, shard: str = "shard-00000") -> Path:
    paths = sorted((out / "work").glob(f"{shard}*.manifest.jsonl"))  # one worker: one file
    assert len(paths) == 1, paths
    return paths[0]


def said(lines: list[str], *words: str) -> bool:
    return any(all(word in line for word in words) for line in lines)


def test_garbage_line_in_the_middle_of_a_manifest(copy, tmp_path):
    source, out, before = copy
    path = work_manifest(out)
    rows = read_jsonl(path)
    lines = path.read_bytes().split(b"\n")
    middle = len(rows) // 2
    victim = rows[middle]["id"]
    lines[middle] = b'{"id": "' + victim.encode() + b'", "audio": \x00\xff garbage'  # overwritten in place
    path.write_bytes(b"\n".join(lines))

    after, log = rerun(source, out, tmp_path / "log")
    assert redone(before, after) == {victim}
    assert said(log, str(path), f"line {middle + 1} is not a manifest row; dropped")
    assert said(log, "shard-00000 was marked done", "opening it again")
    assert len(read_jsonl(path)) == len(rows)  # repaired: whole rows only (read strictly), the garbage gone


@pytest.mark.parametrize("cut", ["zero-bytes", "half"])
def test_empty_or_truncated_audio_is_spoken_again(copy, tmp_path, cut):
    source, out, before = copy
    victim = read_jsonl(work_manifest(out, "shard-00001"))[1]
    audio = out / victim["audio"]
    data = audio.read_bytes()
    audio.write_bytes(b"" if cut == "zero-bytes" else data[: len(data) // 2])

    after, log = rerun(source, out, tmp_path / "log")
    assert redone(before, after) == {victim["id"]}
    expected = "does not decode" if cut == "zero-bytes" else f"the row says {victim['num_samples']}"
    assert said(log, victim["id"], str(audio), expected, "spoken again")
    assert audio.read_bytes() == data  # the tone voice is deterministic: the same audio again


def test_stats_file_that_does_not_parse(copy, tmp_path):
    source, out, before = copy
    stats = out / "work" / "shard-00000.stats.json"
    stats.write_bytes(stats.read_bytes()[:25])

    after, log = rerun(source, out, tmp_path / "log")
    assert redone(before, after) == set()  # every row was whole: only the stats are written again
    assert said(log, str(stats), "does not parse", "opening the shard again")
    written = orjson.loads(stats.read_bytes())
    assert written["done"] == written["segments"] > 0 and written["failed"] == 0


def test_deleted_plan_shard_file_is_made_again(copy, tmp_path):
    source, out, before = copy
    shard_file = out / "plan" / "shards" / "shard-00001.jsonl"
    kept = shard_file.read_bytes()
    shard_file.unlink()

    after, log = rerun(source, out, tmp_path / "log")
    assert shard_file.read_bytes() == kept  # the plan is a function of the input and its settings
    assert redone(before, after) == set()
    assert said(log, "plan files missing: shard-00001.jsonl", "remaking the plan")


def test_damaged_merged_outputs_are_rebuilt_the_same(copy, tmp_path):
    source, out, before = copy
    manifest, summary = out / "manifest.jsonl", out / "summary.json"
    whole = manifest.read_bytes()
    manifest.write_bytes(whole[: len(whole) // 2] + b"\x00garbage\n")
    summary.unlink()

    after, _ = rerun(source, out, tmp_path / "log")
    assert redone(before, after) == set()
    assert manifest.read_bytes() == whole
    assert orjson.loads(summary.read_bytes())["complete"] is True


def test_the_check_of_a_finished_output_finds_the_same_damage_in_several_processes(copy):
    _, out, rows = copy
    first, second = sorted(rows)[:2]
    audio = out / rows[first]["audio"]
    audio.write_bytes(audio.read_bytes()[: audio.stat().st_size // 2])
    manifest = out / "manifest.jsonl"
    manifest.write_bytes(manifest.read_bytes() + orjson.dumps(rows[second]) + b"\n")

    alone = check_complete(out)
    assert any(first in line and "frames on disk" in line for line in alone), alone
    assert f"{second} appears 2 times in the manifest" in alone
    assert check_complete(out, processes=3) == alone
