"""Shared helpers for the tests: realistic input from ../shared/data, running the real scripts."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import orjson
import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data" / "llava_gpt4_qa_30x3.jsonl"


def llava_conversations(images: int | None = None) -> list[dict]:
    """Real LLaVA-Instruct text (GPT-4 answers about COCO images) as conversation records."""
    by_image: OrderedDict[str, dict] = OrderedDict()
    for line in SHARED_DATA.read_bytes().splitlines():
        row = orjson.loads(line)
        record = by_image.setdefault(row["id"], {"id": row["id"], "image": row["image"], "conversations": []})
        question = row["instruction"] if record["conversations"] else f"<image>\n{row['instruction']}"
        record["conversations"] += [{"from": "human", "value": question}, {"from": "gpt", "value": row["output"]}]
    records = list(by_image.values())
    return records[:images] if images else records


def write_input(path: Path, records: list[dict], jsonl: bool = False) -> Path:
    if jsonl:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    else:
        path.write_bytes(orjson.dumps(records, option=orjson.OPT_INDENT_2))
    return path


def script_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHON"] = sys.executable
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_all(*args, env: dict | None = None, timeout: float = 300, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "run_all.sh"), *map(str, args)], env=env or script_env(),
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **popen,
    )


def read_jsonl(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def plan_ids(out: Path) -> list[str]:
    ids = []
    for shard in sorted((out / "plan" / "shards").glob("shard-?????.jsonl")):
        ids += [row["id"] for row in read_jsonl(shard)]
    return ids


def assert_complete(out: Path) -> list[dict]:
    """Every planned id exactly once in the manifest; every audio file decodes and matches its row."""
    rows = read_jsonl(out / "manifest.jsonl")
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "an id appears twice in the manifest"
    assert sorted(ids) == sorted(plan_ids(out))
    for row in rows:
        info = sf.info(out / row["audio"])
        assert info.frames == row["num_samples"] > 0
        assert info.samplerate == row["sample_rate"]
        assert abs(info.duration - row["duration"]) < 1e-3
        data, _ = sf.read(out / row["audio"])
        assert len(data) == info.frames
    on_disk = {str(p.relative_to(out)) for p in (out / "audio").rglob("*") if p.is_file()}
    assert on_disk == {r["audio"] for r in rows}, "stray or missing audio files"
    return rows


@pytest.fixture
def small_input(tmp_path) -> Path:
    """Four real conversations: about fifty segments at 30 words."""
    return write_input(tmp_path / "convs.json", llava_conversations(4))
