"""The whole pipeline through the real CosyVoice runtime: run_all.sh on two CPU slots, a tiny random model."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from conftest import REPO, assert_complete, llava_conversations, run_all, write_input
from convtts.config import load_config
from convtts.testing.cosyvoice_model import build_model_dir
from convtts.testing.cosyvoice_v1 import expected_samples, text_token_counts

pytestmark = [pytest.mark.cosyvoice, pytest.mark.e2e]

RATIO = 3  # speech tokens per text token: short audio keeps the test fast
VOICES = ("英文女", "英文男")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("cv") / "tiny", "tiny", VOICES, tokens_per_text_token=RATIO)


def cosyvoice_args(model_dir, *extra):
    return (
        "--config",
        REPO / "configs" / "cosyvoice.yaml",
        "--gpus",
        "cpu:2",
        "--set",
        f"tts.cosyvoice.model_dir={model_dir}",
        "--set",
        "tts.cosyvoice.fp16=false",
        "--set",
        "shards.segments_per_shard=6",
        *extra,
    )


@pytest.mark.slow
def test_run_all_speaks_through_cosyvoice(tmp_path, model_dir):
    source = write_input(tmp_path / "in.json", llava_conversations(2))
    out, log = tmp_path / "out", tmp_path / "log"
    # rebuild every 4 utterances: several rebuilds land in the middle of shards
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        log,
        *cosyvoice_args(model_dir, "--set", "workers.rebuild_every=4", "--set", "tts.cosyvoice.batch_size=1"),
    )
    assert result.returncode == 0, result.stderr + "".join(p.read_text() for p in log.rglob("*.log"))
    rows = assert_complete(out)
    assert {r["backend"] for r in rows} == {"cosyvoice"} and {r["sample_rate"] for r in rows} == {22050}

    # durations are what the pinned decode length predicts for each spoken text
    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    # one at a time, as the run spoke them (the shipped config batches its LLM and flow in bf16)
    config = load_config(
        REPO / "configs" / "cosyvoice.yaml",
        [f"tts.cosyvoice.model_dir={model_dir}", "tts.cosyvoice.fp16=false", "tts.cosyvoice.batch_size=1"],
    )
    backend = CosyVoiceBackend(config)
    for row in rows:
        assert row["num_samples"] == expected_samples(text_token_counts(backend.model.frontend, row["text"]), RATIO), (
            row["id"]
        )

    # speakers as configured: one voice per side within a conversation, both voices in use
    for cid in {r["conversation_id"] for r in rows}:
        sides = {r["side"]: r["speaker"] for r in rows if r["conversation_id"] == cid}
        assert set(sides.values()) == set(VOICES)

    rebuilds = [
        line for p in log.rglob("slot-*.log") for line in p.read_text().splitlines() if "(every 4 utterances)" in line
    ]
    assert len(rebuilds) >= 2, "no rebuild happened"
    assert max(r["since_build"] for r in rows) <= 4 and len({r["since_build"] for r in rows}) >= 3

    # Rebuilds mid-shard change nothing: each file equals the same utterance spoken by one model
    # that was never rebuilt, in this process, in another order.
    for row in reversed(rows):
        audio, _ = sf.read(out / row["audio"], dtype="int16")
        assert np.array_equal(audio, as_written(backend.synthesize(row["text"], row["speaker"], row["seed"]))), row[
            "id"
        ]


@pytest.mark.slow
def test_run_all_speaks_batched(tmp_path, model_dir):
    """The batched engine through the whole pipeline: rows share decode steps, rebuilds fall between batches."""
    source = write_input(tmp_path / "in.json", llava_conversations(2))
    out, log = tmp_path / "out", tmp_path / "log"
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        log,
        *cosyvoice_args(
            model_dir, "--set", "workers.rebuild_every=5", "--set", "tts.cosyvoice.batch_size=4", "--workers", "1"
        ),
    )
    assert result.returncode == 0, result.stderr + "".join(p.read_text() for p in log.rglob("*.log"))
    rows = assert_complete(out)
    slot_log = "".join(p.read_text() for p in log.rglob("slot-*.log"))
    assert "of 4 rows each" in slot_log and "(every 5 utterances)" in slot_log
    # the feed stops once a rebuild is due; what is in flight still finishes: the 4 rows and what the
    # engine takes ahead of them (a request whose frontend runs early, a decoded row waiting for the
    # flow), never twice the rows
    assert max(r["since_build"] for r in rows) <= 5 - 1 + 2 * 4

    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    config = load_config(
        REPO / "configs" / "cosyvoice.yaml", [f"tts.cosyvoice.model_dir={model_dir}", "tts.cosyvoice.batch_size=1"]
    )
    backend = CosyVoiceBackend(config)
    for row in rows:
        assert row["num_samples"] == expected_samples(text_token_counts(backend.model.frontend, row["text"]), RATIO), (
            row["id"]
        )
    # As the one-at-a-time path (fp32) speaks it, within bf16's rounding: the shipped config runs the LLM
    # and the flow in bf16, which rounds each value to u = 2**-8 (3.9e-3) of its size, and the vocoder in
    # fp32 on a CPU. The same tokens drawn (the pinned model's), the bf16 flow's audio stands within
    # 2e-3 of full scale of fp32 (FLOW_BF16, test_flow_vocoder.py: half a unit); 650 int16 steps are
    # 0.02 of full scale, 5 units.
    for row in rows[:6]:
        audio, _ = sf.read(out / row["audio"], dtype="int16")
        solo = as_written(backend.synthesize(row["text"], row["speaker"], row["seed"]))
        assert np.abs(audio.astype(int) - solo.astype(int)).max() <= 650, row["id"]


@pytest.mark.slow
def test_a_broken_batch_is_spoken_one_at_a_time(tmp_path, model_dir):
    source = write_input(tmp_path / "in.json", llava_conversations(1))
    out, log = tmp_path / "out", tmp_path / "log"
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        log,
        *cosyvoice_args(
            model_dir,
            "--set",
            "tts.backend=broken_batch_backend:BrokenBatchCosyVoice",
            "--set",
            "tts.cosyvoice.batch_size=4",
            "--workers",
            "1",
        ),
    )
    assert result.returncode == 0, result.stderr + "".join(p.read_text() for p in log.rglob("*.log"))
    rows = assert_complete(out)
    worker_log = "".join(p.read_text() for p in log.rglob("slot-*-worker-*.log"))
    assert "a batch failed (RuntimeError: shared decode step broke (test)); speaking its" in worker_log
    assert any(r["attempts"] == 2 for r in rows) and not (out / "failures.jsonl").read_text().strip()


def as_written(samples) -> np.ndarray:
    """The int16 samples a WAV written by the pipeline holds for these float samples."""
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(samples, -1.0, 1.0), 22050, subtype="PCM_16", format="WAV")
    buffer.seek(0)
    return sf.read(buffer, dtype="int16")[0]


def test_unknown_speaker_and_missing_model_stop_before_any_work(tmp_path, model_dir):
    source = write_input(tmp_path / "in.json", llava_conversations(1))
    unknown = run_all(
        "--input",
        source,
        "--output-dir",
        tmp_path / "a",
        *cosyvoice_args(model_dir, "--set", "speakers.voices=[英文女, narrator]"),
    )
    assert unknown.returncode == 2
    assert "narrator" in unknown.stderr and "英文男" in unknown.stderr  # names the valid speakers
    missing = run_all("--input", source, "--output-dir", tmp_path / "b", *cosyvoice_args(tmp_path / "no-such-model"))
    assert missing.returncode == 2 and "no-such-model" in missing.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_run_all_with_automatic_rows_and_the_fast_decode(tmp_path, model_dir):
    """batch_size 0: the slot picks the rows (8 on a CPU) and hands them to its workers; tokens drawn by the
    GPU sampler's rule (run here on the CPU), the LLM in bf16: every segment at its pinned length."""
    source = write_input(tmp_path / "in.json", llava_conversations(1))
    out, log = tmp_path / "out", tmp_path / "log"
    result = run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        log,
        *cosyvoice_args(
            model_dir,
            "--set",
            "tts.cosyvoice.batch_size=0",
            "--set",
            "tts.cosyvoice.sampler=gpu",
            "--set",
            "tts.cosyvoice.precision.llm=bf16",
            "--workers",
            "1",
        ),
    )
    assert result.returncode == 0, result.stderr + "".join(p.read_text() for p in log.rglob("*.log"))
    rows = assert_complete(out)
    slot_log = "".join(p.read_text() for p in log.rglob("slot-*.log"))
    assert "rows: 8 per worker (automatic, CPU)" in slot_log and "of 8 rows each" in slot_log

    from convtts.speak.cosyvoice.backend import CosyVoiceBackend

    config = load_config(
        REPO / "configs" / "cosyvoice.yaml", [f"tts.cosyvoice.model_dir={model_dir}", "tts.cosyvoice.batch_size=1"]
    )
    frontend = CosyVoiceBackend(config).model.frontend
    for row in rows:
        assert row["num_samples"] == expected_samples(text_token_counts(frontend, row["text"]), RATIO), row["id"]
