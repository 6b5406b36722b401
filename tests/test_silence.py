"""The benchmarking backend end to end through run_all.sh: silence of the planned length, every id once."""

from __future__ import annotations

import orjson
import pytest
import soundfile as sf

from conftest import assert_complete, run_all

pytestmark = pytest.mark.e2e

SILENCE = ("--set", "tts.backend=silence", "--set", "shards.segments_per_shard=8")


def test_silence_backend_runs_the_whole_pipeline(tmp_path, small_input):
    out = tmp_path / "out"
    result = run_all(
        "--input",
        small_input,
        "--output-dir",
        out,
        "--gpus",
        "cpu:2",
        *SILENCE,
        "--set",
        "tts.silence.sample_rate=16000",
        "--log-dir",
        tmp_path / "log",
    )
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)  # each planned id once; each file decodes to the frames its row says
    assert len(rows) > 40 and {r["backend"] for r in rows} == {"silence"}
    for row in rows:  # 150 words a minute: 0.4 s a word
        assert row["sample_rate"] == 16000
        assert row["num_samples"] == round(len(row["text"].split()) * 0.4 * 16000)
    audio, rate = sf.read(out / rows[0]["audio"])
    assert rate == 16000 and len(audio) == rows[0]["num_samples"] and not audio.any()
    plan = orjson.loads((out / "plan" / "plan.json").read_bytes())
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["complete"] and summary["backends"] == ["silence"]
    assert summary["audio_hours"] == pytest.approx(plan["estimated_hours"], abs=1e-3)


def test_silence_backend_rate_is_checked_before_anything_starts(tmp_path, small_input):
    out = tmp_path / "out"
    result = run_all("--input", small_input, "--output-dir", out, *SILENCE, "--set", "tts.silence.sample_rate=100")
    assert result.returncode == 2
    assert "tts.silence.sample_rate" in result.stderr and not out.exists()
