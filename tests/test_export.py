"""export.py on real outputs, each export loaded back by its own library: datasets, lhotse, webdataset, NeMo.

One output spoken by the default Piper voice serves the format tests (module fixture): ShareGPT
records with odd ids (a dot, a space, a colon, a duplicate, none at all), in shards of a few segments
so that an export has several units. Resume is tested by SIGKILL on a real export.
"""

from __future__ import annotations

import fcntl
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import soundfile as sf

from conftest import (
    REPO,
    assert_complete,
    llava_conversations,
    need,
    read_jsonl,
    run_all,
    script_env,
    sharegpt_conversations,
    write_input,
)
from convtts.results.export.runner import load_state

pytestmark = pytest.mark.e2e

# The English voice skips the Russian "dup-case" and the Chinese record without an id: "team/alpha/12"
# keeps the output at five shards of speech.
ODD_IDS = {"translate.v2", "conv 7", "chat:2024-05-01 #3", "dup-case", None, "team/alpha/12"}
EXPORTED = (
    "id",
    "conversation_id",
    "source_id",
    "turn",
    "segment",
    "role",
    "side",
    "speaker",
    "language",
    "text",
    "source_text",
    "num_samples",
    "sample_rate",
    "backend",
    "seed",
)


def export(out: Path, fmt: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "export.py"), str(out), "--format", fmt, *map(str, args)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def exported(out: Path, fmt: str, *args) -> Path:
    result = export(out, fmt, *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # quiet off a terminal: the closing line only
    assert result.stdout.startswith("exported ") and result.stdout.count("\n") == 1, result.stdout
    return Path(args[args.index("--dest") + 1]) if "--dest" in args else out / "export" / fmt


@pytest.fixture(scope="module")
def spoken(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A finished Piper output of about 20 segments in 5 plan shards, and its manifest rows."""
    base = tmp_path_factory.mktemp("spoken")
    records = [r for r in sharegpt_conversations() if r.get("id") in ODD_IDS]
    source = write_input(base / "convs.json", records)
    out = base / "out"
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        base / "log",
        "--gpus",
        "cpu:1",
        "--set",
        "shards.segments_per_shard=4",
    )
    assert result.returncode == 0, result.stderr + result.stdout
    rows = assert_complete(out)
    assert len({Path(r["audio"]).parent.name for r in rows}) >= 5
    assert any("." in r["id"] for r in rows)  # translate.v2: a dot webdataset keys must not split at
    return out, rows


def samples(path: Path | bytes) -> np.ndarray:
    data, _ = sf.read(io.BytesIO(path) if isinstance(path, bytes) else path, dtype="int16")
    return data


def test_every_field_a_user_trains_with_is_in_every_format():
    """One row schema (convtts/state/rows.py): the parquet has a column of its type for each field,
    lhotse a place of its own or `custom`, and the manifest row each field the plan gives."""
    from convtts.results.export.hf import COLUMNS
    from convtts.results.export.lhotse_format import CUSTOM
    from convtts.run.utterance import MANIFEST_FIELDS
    from convtts.state.rows import FIELDS

    columns = {name: dtype for name, _, dtype in COLUMNS}
    assert columns == {field.name: field.kind for field in FIELDS if field.kind != "audio"}
    assert set(CUSTOM) == {field.name for field in FIELDS if not field.in_lhotse}
    assert MANIFEST_FIELDS == tuple(field.name for field in FIELDS if field.planned)
    assert MANIFEST_FIELDS[:2] == ("id", "conversation_id") and "prompt_audio" not in MANIFEST_FIELDS


def test_hugging_face_parquet_loads_with_datasets(spoken):
    datasets = need("datasets", "export-test")
    pq = need("pyarrow.parquet", "export")
    out, rows = spoken
    dest = exported(out, "hf", "--shard-rows", 6)
    parts = sorted((dest / "data").glob("train-*.parquet"))
    state = orjson.loads((dest / ".export-state.json").read_bytes())
    assert state["finished"] and {f"data/{p.name}" for p in parts} == {
        f for u in state["units"].values() for f in u["files"]
    }
    assert len(parts) >= 3 and all(pq.ParquetFile(p).metadata.num_rows <= 6 for p in parts)  # --shard-rows holds
    loaded = datasets.load_dataset(str(dest), split="train")  # no script, no data_files: the layout says it all
    assert isinstance(loaded.features["audio"], datasets.Audio)
    assert loaded.num_rows == len(rows)
    # datasets 4+ decodes audio through torchcodec, which needs FFmpeg's libraries: read the bytes instead
    raw = loaded.cast_column("audio", datasets.Audio(decode=False))
    for row, item in zip(rows, raw):
        assert {k: item[k] for k in EXPORTED} == {k: row[k] for k in EXPORTED}
        assert item["duration"] == pytest.approx(row["duration"], abs=1e-4)
        assert item["audio"]["path"] == Path(row["audio"]).name
        assert np.array_equal(samples(item["audio"]["bytes"]), samples(out / row["audio"]))
    by_files = datasets.load_dataset(
        "parquet", data_files=sorted(glob.glob(str(dest / "data" / "*.parquet"))), split="train"
    )
    assert by_files["id"] == [r["id"] for r in rows]


def test_lhotse_manifests_load_and_cuts_load_audio(spoken):
    lhotse = need("lhotse", "export-test")

    out, rows = spoken
    dest = exported(out, "lhotse", "--shard-rows", 6)
    recordings = lhotse.load_manifest_lazy(dest / "recordings.jsonl.gz")
    supervisions = lhotse.load_manifest_lazy(dest / "supervisions.jsonl.gz")
    assert isinstance(recordings, lhotse.RecordingSet) and isinstance(supervisions, lhotse.SupervisionSet)
    assert [r.id for r in recordings] == [s.recording_id for s in supervisions] == [r["id"] for r in rows]
    cuts = list(lhotse.CutSet.from_jsonl_lazy(dest / "cuts.jsonl.gz"))
    assert len(cuts) == len(rows)
    for row, cut in zip(rows, cuts):
        (supervision,) = cut.supervisions
        assert (cut.id, supervision.text, supervision.speaker) == (row["id"], row["text"], row["speaker"])
        assert supervision.language == row["language"] == "en"
        assert supervision.custom["conversation_id"] == row["conversation_id"]
        assert (supervision.custom["turn"], supervision.custom["segment"], supervision.custom["role"]) == (
            row["turn"],
            row["segment"],
            row["role"],
        )
        assert cut.sampling_rate == row["sample_rate"] and cut.num_samples == row["num_samples"]
        audio = cut.load_audio()
        assert audio.shape == (1, row["num_samples"])
        expected, _ = sf.read(out / row["audio"], dtype="float32")
        assert np.allclose(audio[0], expected, atol=1e-6)
    parts = lhotse.CutSet.from_files(sorted(glob.glob(str(dest / "parts" / "cuts-*.jsonl.gz"))))
    assert sorted(c.id for c in parts) == sorted(r["id"] for r in rows)  # from_files may shuffle the files


def test_webdataset_tars_read_back_one_sample_per_row(spoken):
    wds = need("webdataset", "export-test")

    out, rows = spoken
    dest = exported(out, "webdataset", "--shard-rows", 6)
    shards = sorted(str(p) for p in dest.glob("shard-*.tar"))
    read = list(wds.WebDataset(shards, shardshuffle=False))
    assert len(read) == len(rows)
    for row, sample in zip(rows, read):
        assert set(sample) >= {"wav", "json", "txt"}
        meta = json.loads(sample["json"])
        assert meta["id"] == row["id"] and "." not in sample["__key__"]
        assert sample["txt"].decode() == row["text"]
        assert {k: meta[k] for k in EXPORTED} == {k: row[k] for k in EXPORTED}
        assert np.array_equal(samples(sample["wav"]), samples(out / row["audio"]))
    decoded = next(iter(wds.WebDataset(shards, shardshuffle=False).decode()))
    assert decoded["json"]["text"] == rows[0]["text"]


NEMO_READ = """
import importlib.util, json, sys
import nemo.utils
# NeMo's manifest reader, without nemo.collections.common's package import (it needs NeMo's training
# extras, which would downgrade lightning here)
path = nemo.utils.__path__[0].rsplit("/", 1)[0] + "/collections/common/parts/preprocessing/manifest.py"
spec = importlib.util.spec_from_file_location("nemo_manifest", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(list(module.item_iter(sys.argv[1]))))
"""


def test_nemo_manifest_reads_with_nemos_reader(spoken):
    need("nemo", "export-test")  # installed --no-deps by make test: see pyproject.toml
    out, rows = spoken
    dest = exported(out, "nemo", "--shard-rows", 6)
    result = subprocess.run(
        [sys.executable, "-c", NEMO_READ, str(dest / "manifest.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env=script_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    items = json.loads(result.stdout.splitlines()[-1])
    lines = read_jsonl(dest / "manifest.json")
    assert len(items) == len(lines) == len(rows)
    for row, item, line in zip(rows, items, lines):
        assert item["audio_file"] == str((out / row["audio"]).resolve())
        assert item["text"] == row["text"] and item["speaker"] == row["speaker"]
        assert item["duration"] == pytest.approx(row["duration"], abs=1e-4)
        assert item["orig_sr"] == row["sample_rate"]
        assert {k: line[k] for k in EXPORTED} == {k: row[k] for k in EXPORTED}
        assert np.array_equal(samples(Path(item["audio_file"])), samples(out / row["audio"]))


def test_reexport_redoes_only_what_the_manifest_changed(spoken, tmp_path):
    """A row missing from the manifest (its audio lost), then spoken again by a rerun: one unit is redone."""
    source, rows = spoken
    out = tmp_path / "out"
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("export"))
    lost = rows[len(rows) // 2]
    (out / lost["audio"]).unlink()
    assert (
        subprocess.run(
            [sys.executable, "-m", "convtts.results.merge", str(out)], env=script_env(), capture_output=True
        ).returncode
        == 1
    )  # one pending
    first = export(out, "nemo", "--shard-rows", 6)
    assert first.returncode == 0, first.stderr
    assert len(read_jsonl(out / "export" / "nemo" / "manifest.json")) == len(rows) - 1
    again = export(out, "nemo", "--shard-rows", 6)
    assert " 0 units written" in again.stdout
    before = orjson.loads((out / "export" / "nemo" / ".export-state.json").read_bytes())["units"]
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "export" / "nemo" / "parts").iterdir()}

    respoken = run_all(
        "--input",
        source.parent / "convs.json",
        "--output-dir",
        out,
        "--log-dir",
        tmp_path / "log",
        "--gpus",
        "cpu:1",
        "--set",
        "shards.segments_per_shard=4",
    )
    assert respoken.returncode == 0, respoken.stderr
    third = export(out, "nemo", "--shard-rows", 6)
    assert third.returncode == 0 and " 1 unit written" in third.stdout, third.stdout
    after = orjson.loads((out / "export" / "nemo" / ".export-state.json").read_bytes())["units"]
    (redone,) = [name for name in after if after[name]["fingerprint"] != before[name]["fingerprint"]]
    assert after[redone]["rows"] == before[redone]["rows"] + 1
    changed = {
        p.name for p in (out / "export" / "nemo" / "parts").iterdir() if stamps.get(p.name) != p.stat().st_mtime_ns
    }
    assert changed and changed <= {Path(f).name for f in after[redone]["files"]}, changed
    fresh = export(out, "nemo", "--shard-rows", 6, "--dest", tmp_path / "fresh")
    assert fresh.returncode == 0
    assert (out / "export" / "nemo" / "manifest.json").read_bytes() == (
        tmp_path / "fresh" / "manifest.json"
    ).read_bytes()
    assert [line["id"] for line in read_jsonl(tmp_path / "fresh" / "manifest.json")] == [r["id"] for r in rows]


@pytest.fixture(scope="module")
def paced_flac(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A bigger output, quickly: 30 conversations spoken as tones (tests/paced_backend.py), in FLAC."""
    base = tmp_path_factory.mktemp("paced")
    source = write_input(base / "convs.json", llava_conversations())
    out = base / "out"
    env = script_env(CONVTTS_TEST_UTTERANCE_SECONDS=0)
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        base / "log",
        "--gpus",
        "cpu:1",
        "--set",
        "tts.backend=paced_backend:PacedTone",
        "--set",
        "shards.segments_per_shard=10",
        "--set",
        "output.audio_format=flac",
        env=env,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    return out, assert_complete(out)


def test_killed_export_finishes_on_rerun_with_the_same_result(paced_flac, tmp_path):
    pq = need("pyarrow.parquet", "export")
    out, rows = paced_flac
    dest = tmp_path / "killed"
    args = [
        sys.executable,
        str(REPO / "export.py"),
        str(out),
        "--format",
        "hf",
        "--shard-rows",
        "3",
        "--dest",
        str(dest),
    ]
    process = subprocess.Popen(args, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while process.poll() is None and not (dest.is_dir() and load_state(dest)["units"]):  # a unit's line is in
        time.sleep(0.001)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the export finished before it could be killed"
    killed_state = load_state(dest)
    assert not killed_state["finished"]
    # each finished unit was a line appended; the state as a whole was written before the first
    assert orjson.loads((dest / ".export-state.json").read_bytes())["units"] == {}
    assert len(read_jsonl(dest / ".export-state.jsonl")) >= len(killed_state["units"])

    rerun = subprocess.run(args, env=script_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    skipped = int(rerun.stdout.split(" already up to date")[0].rsplit(" ", 1)[1])
    assert skipped >= len(killed_state["units"])  # the finished units were not written again
    assert not [p for p in dest.rglob(".*.tmp")]
    clean = export(out, "hf", "--shard-rows", 3, "--dest", tmp_path / "clean")
    assert clean.returncode == 0
    names = sorted(p.name for p in (dest / "data").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "clean" / "data").iterdir())
    for name in names:
        assert pq.read_table(dest / "data" / name).equals(pq.read_table(tmp_path / "clean" / "data" / name)), name
    table = pq.read_table(dest / "data", columns=["id", "audio"])
    assert table.column("id").to_pylist() == [r["id"] for r in rows]
    for row, audio in zip(rows, table.column("audio").to_pylist()):
        assert audio["path"].endswith(".flac")
        assert np.array_equal(samples(audio["bytes"]), samples(out / row["audio"]))  # FLAC is lossless


def test_webdataset_keeps_flac_members(paced_flac, tmp_path):
    wds = need("webdataset", "export-test")

    out, rows = paced_flac
    dest = exported(out, "webdataset", "--dest", tmp_path / "wds")
    read = list(wds.WebDataset(sorted(str(p) for p in dest.glob("*.tar")), shardshuffle=False))
    assert [json.loads(s["json"])["id"] for s in read] == [r["id"] for r in rows]
    assert all("flac" in s and "wav" not in s for s in read)


def test_errors_exit_2_and_a_held_destination_exits_3(spoken, tmp_path):
    missing = export(tmp_path / "nothing", "hf")
    assert missing.returncode == 2 and "no manifest" in missing.stderr
    assert not (tmp_path / "nothing").exists()
    unknown = export(spoken[0], "csv")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr
    bad = export(spoken[0], "hf", "--shard-rows", 0)
    assert bad.returncode == 2 and "--shard-rows" in bad.stderr
    dest = tmp_path / "held"
    dest.mkdir()
    with open(dest / ".export.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = export(spoken[0], "nemo", "--dest", dest)
    assert held.returncode == 3 and "another export" in held.stderr
    os.remove(dest / ".export.lock")


def test_a_numeric_source_id_goes_into_the_parquet_as_text(tmp_path):
    """An input record's own id may be a JSON number ("id": 17); the parquet's column is text."""
    pq = need("pyarrow.parquet", "export")
    from convtts.results.export.hf import HuggingFace

    part = HuggingFace().open_part(tmp_path, "00000", 0)
    part.add({"id": "17-000-00", "source_id": 17, "turn": 0}, tmp_path / "17-000-00.wav", b"RIFF")
    part.commit()
    table = pq.read_table(tmp_path / "data" / "train-00000-000.parquet")
    assert table.column("source_id").to_pylist() == ["17"] and table.column("turn").to_pylist() == [0]
