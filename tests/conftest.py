"""Shared helpers for the tests: the sample conversations in tests/data, running the real scripts."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from convtts.state.verify import check_complete

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
# A checkout of the official CosyVoice runtime, for the tests that ask for it by name
# (tests/test_cosyvoice_v2_v3.py); every other test, and every run they start, uses the installed
# package whatever the environment says.
COSYVOICE_CHECKOUT = os.environ.pop("COSYVOICE_ROOT", "")


def llava_conversations(images: int | None = None) -> list[dict]:
    """The LLaVA-Instruct style sample: 30 image conversations, two or three questions each, long answers."""
    records = orjson.loads((DATA / "llava_style.json").read_bytes())
    return records[:images] if images else records


def sharegpt_conversations() -> list[dict]:
    """The ShareGPT style sample: odd ids, several languages, code, links, empty turns, one-letter answers."""
    return read_jsonl(DATA / "sharegpt_style.jsonl")


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


def speak_with_two_refused(backend, texts: list[str], speaker: str) -> dict:
    """Speak texts in one batch (seed 1000 + index) with item 2 in an unknown voice and item 4 empty.

    Asserts those two fail, each with a SynthesisError of its own; returns every result by index.
    """
    from convtts.speak.base import SynthesisError

    mixed = [(i, text, speaker, 1000 + i) for i, text in enumerate(texts)]
    mixed[2] = (2, texts[2], "nobody", 1002)  # refused by the frontend
    mixed[4] = (4, "", speaker, 1004)  # nothing to speak
    results = dict(backend.synthesize_many(mixed))
    assert isinstance(results[2], SynthesisError) and "nobody" in str(results[2])
    assert isinstance(results[4], SynthesisError)
    return results


def run_short_of_memory(monkeypatch, engine_class, rows: int) -> None:
    """Make engine_class's decode step raise CUDA's out-of-memory error while more than `rows` rows are live."""
    import torch

    step = engine_class._step

    def short_of_memory(engine):
        if len(engine.rows) > rows:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return step(engine)

    monkeypatch.setattr(engine_class, "_step", short_of_memory)


def assert_complete(out: Path) -> list[dict]:
    """Every planned id exactly once in the manifest; every audio file decodes and matches its row."""
    problems = check_complete(out)
    assert not problems, "\n".join(problems[:20])
    return read_jsonl(out / "manifest.jsonl")


@pytest.fixture
def small_input(tmp_path) -> Path:
    """Four sample conversations: fifty segments at 30 words."""
    return write_input(tmp_path / "convs.json", llava_conversations(4))
