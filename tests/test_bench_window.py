"""The benchmarks' timed window (bench/throughput.py): the steady figure starts once every worker
has written, so a worker that holds its takes for the gate's batch is not charged for its first wait."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, need, script_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from throughput import MIN_STEADY_SECONDS, whole_job, windowed  # bench/ is not a package


def rows_of(worker: str, times: list[float], duration: float = 2.0) -> list[dict]:
    return [{"worker": worker, "finished": t, "duration": duration} for t in times]


def test_the_steady_figure_starts_at_the_last_workers_first_write():
    """w0 writes a row every second from t=1; w1 holds 20 takes and writes them at t=30, 50 and 70.
    Over the whole window w1's first wait counts against it; from t=30 on, only what came after."""
    rows = rows_of("w0", [float(t) for t in range(1, 81)]) + rows_of("w1", [30.0] * 20 + [50.0] * 20 + [70.0] * 20)
    figures = windowed(rows, 0.0, 80.0)
    assert figures["audio_seconds_per_second"] == round((80 + 60) * 2.0 / 80, 3)
    assert figures["steady_seconds"] == 50.0
    assert figures["steady_audio_seconds_per_second"] == round((50 + 40) * 2.0 / 50, 3)


def test_no_steady_figure_when_a_worker_wrote_too_late_to_measure():
    rows = rows_of("w0", [1.0, 2.0, 3.0]) + rows_of("w1", [80.0 - MIN_STEADY_SECONDS / 2])
    figures = windowed(rows, 0.0, 80.0)
    assert figures["steady_audio_seconds_per_second"] is None
    assert figures["audio_seconds_per_second"] == round(4 * 2.0 / 80, 3)


def test_a_whole_job_counts_every_row_over_the_commands_wall_time():
    """A job run to its end: rows held for the gate and written late, and the start-up before the
    first row, all count, over the wall time of the whole command."""
    rows = rows_of("w0", [5.0, 6.0, 7.0]) + rows_of("w1", [40.0] * 10)
    assert whole_job(rows, 50.0)["whole_job_audio_seconds_per_second"] == round(13 * 2.0 / 50.0, 3)
    assert whole_job([], 50.0)["whole_job_audio_seconds_per_second"] is None


def test_the_end_to_end_bench_gives_each_workers_gpu_memory_peak():
    """bench/e2e.py reads each worker's largest gpu_mb from the manifest rows (what max_gpu_mb is
    compared with); rows of a CPU run (0) give nothing, and the printout leaves the line out."""
    from e2e import gpu_mb_peak

    rows = [
        {"worker": "slot0-w1", "gpu_mb": 15000.0},
        {"worker": "slot0-w0", "gpu_mb": 16008.5},
        {"worker": "slot0-w1", "gpu_mb": 17420.0},
        {"worker": "slot0-w0", "gpu_mb": 9000.0},
    ]
    assert gpu_mb_peak(rows) == {"slot0-w0": 16008.5, "slot0-w1": 17420.0}
    assert gpu_mb_peak([{"worker": "slot0-w0", "gpu_mb": 0.0}, {"worker": "slot0-w1"}]) == {}


def test_the_end_to_end_timeline_spreads_each_rows_audio_over_its_time_in_flight():
    """Work per bin sums to the job's audio over the bin width, a row counts in flight only while begun and
    not finished, and finished audio lands in the bin of its end: a start-up bin with nothing in flight
    reads 0 where the steady bins read the job's rate."""
    from e2e import timeline

    started = 1000.0
    rows = [  # began at 5 s (in flight 5-15 s), and 12-14 s
        {"finished": started + 15.0, "synthesis_seconds": 10.0, "duration": 20.0},
        {"finished": started + 14.0, "synthesis_seconds": 2.0, "duration": 4.0},
    ]
    line = timeline(rows, started, wall=16.0)
    assert line["rows_in_flight"] == [0, 1, 1, 0]  # 2-s row over 5 s of its bin: 0.4 of a row, rounded
    assert line["work_audio_s_per_s"] == [0.0, 2.0, 2.8, 0.0]  # 2 audio s/s for the long row; +2 for 2 s of 5
    assert line["finished_audio_s_per_s"] == [0.0, 0.0, 0.8, 4.0]
    assert sum(line["work_audio_s_per_s"]) * line["bin_seconds"] == sum(r["duration"] for r in rows)


def test_the_end_to_end_bench_reads_nvidia_smis_power_samples_into_bins():
    """Samples are placed by their own timestamps (the host's local time), a GPU without a reading is
    left out, and a bin with no sample says None rather than 0 W."""
    from datetime import datetime

    from e2e import parse_power, power_by_bin

    started = datetime(2026, 11, 27, 12, 0, 0).timestamp()
    text = "\n".join(
        [
            "2026/11/27 12:00:01.000, 0, 100.0",
            "2026/11/27 12:00:02.000, 0, 300.0",
            "2026/11/27 12:00:02.500, 1, [N/A]",
            "2026/11/27 12:00:12.000, 0, 650.5",
            "2026/11/27 12:00:03.000, 1, 70.0",
        ]
    )
    samples = parse_power(text)
    assert [(gpu, watts) for _, gpu, watts in samples] == [(0, 100.0), (0, 300.0), (0, 650.5), (1, 70.0)]
    assert power_by_bin(samples, started, wall=14.0) == {"0": [200, None, 650], "1": [70, None, None]}


def test_the_marginal_steady_state_is_the_slope_of_wall_time_over_audio(tmp_path):
    """bench/marginal.py fits wall = fixed + audio / rate over jobs of several sizes: three jobs on the line
    of 11 s plus audio at 270 audio s/s give back 270 and 11; a job that did not exit 0 is left out, the
    engines are fitted apart, and one size alone (or a slope of no cost) gives no fit."""
    import json

    from marginal import fit, jobs

    def job(name: str, conversations: int, audio: float, wall: float, engine: str = "bash", code: int = 0) -> Path:
        run = {"engine": engine, "exit_code": code, "audio_seconds": audio, "wall_seconds": wall}
        path = tmp_path / name
        path.write_text(json.dumps({"conversations": conversations, "runs": [run]}))
        return path

    files = [
        job("a.json", 300, 7550.0, 11 + 7550 / 270),
        job("b.json", 1000, 25197.0, 11 + 25197 / 270),
        job("c.json", 2000, 50442.0, 11 + 50442 / 270),
        job("d.json", 300, 7550.0, 300.0, code=1),  # a failed job: not a point of the line
        job("e.json", 300, 7550.0, 40.0, engine="ray"),
    ]
    found = jobs(files)
    assert sorted(found) == ["bash", "ray"]
    assert len(found["bash"]) == 3
    assert fit(found["bash"]) == {"rate": 270.0, "fixed_seconds": 11.0, "jobs": 3}
    assert fit(found["ray"]) is None  # one size
    flat = [dict(r, wall=50.0) for r in found["bash"]]
    assert fit(flat) is None  # more audio took no longer


def test_the_scaling_bench_sets_each_gpu_against_one_gpu_and_ray_against_run_all():
    from scaling import table

    def run(gpus, engine, rate, problems=0):
        return {
            "text": "short",
            "gpus": gpus,
            "engine": engine,
            "exit_code": 0,
            "wall_seconds": 100.0,
            "end_to_end_audio_s_per_s": rate,
            "problems": problems,
        }

    lines = table([run(1, "bash", 100.0), run(4, "bash", 360.0), run(4, "ray", 342.0, problems=2)])
    assert [(x["per_gpu"], x["per_gpu_of_one"], x["of_run_all"]) for x in lines] == [
        (100.0, 1.0, None),
        (90.0, 0.9, None),
        (85.5, 0.855, 0.95),  # Ray's one-GPU run left out: each GPU set against run_all.sh's one GPU
    ]
    assert lines[2]["problems"] == 2


def test_the_benches_set_the_visible_gpus_for_what_they_start_and_put_them_back(monkeypatch):
    from e2e import cuda_visible

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with cuda_visible("2,3"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with cuda_visible(None):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    try:
        with cuda_visible("1"):
            raise RuntimeError("a run that failed")
    except RuntimeError:
        pass
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_the_text_kinds_bench_matches_words_unless_both_counts_are_given(tmp_path):
    import argparse

    import text_kinds

    both = argparse.Namespace(conversations=1480, bench_conversations=1000)
    assert text_kinds.counts(both, tmp_path) == (1480, 1000)
    matched = argparse.Namespace(conversations=None, bench_conversations=20)
    short, long = text_kinds.counts(matched, tmp_path)
    assert long == 20 and short > 20  # short turns hold fewer words a conversation
    text_kinds.e2e.make_conversations(long, tmp_path / "q.json", "bench")
    text_kinds.e2e.make_conversations(short, tmp_path / "s.json", "short")
    text_kinds.e2e.make_conversations(short - 1, tmp_path / "s1.json", "short")
    target = text_kinds.words(tmp_path / "q.json")
    assert text_kinds.words(tmp_path / "s1.json") < target <= text_kinds.words(tmp_path / "s.json")


def bench_figures(script: str, args: list[str], out: Path) -> dict:
    """bench/SCRIPT run with args and --out OUT in a fresh interpreter; the figures it wrote."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args, "--out", str(out)],
        env=script_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.e2e
@pytest.mark.cosyvoice
def test_the_text_kinds_bench_runs_each_job_again_with_the_compared_settings(tmp_path):
    """--compare: each text's job runs a second time, right after the first, with the settings added; the
    workers of those jobs alone take them (on a CPU the flow attention kernel is refused, with a warning);
    both ratios are written."""
    need("cosyvoice", "cosyvoice")
    setting, work, out = "tts.cosyvoice.flow.attention=triton", tmp_path / "work", tmp_path / "kinds.json"
    figures = bench_figures(
        "text_kinds.py",
        ["--size", "tiny", "--model-dir", str(tmp_path / "m"), "--conversations", "2", "--bench-conversations", "1"]
        + ["--gpus", "cpu:1", "--work", str(work), "--compare", setting],
        out,
    )
    runs, compared = figures["runs"], figures["compared"]["runs"]
    assert [r["text"] for r in runs] == [r["text"] for r in compared] == ["short", "bench"]
    assert [r["settings"] for r in runs] == [[], []] and [r["settings"] for r in compared] == [[setting]] * 2
    assert all(r["exit_code"] == 0 and r["utterances"] > 0 for r in runs + compared)
    assert figures["ratio"] > 0 and figures["compared"]["ratio"] > 0
    for text in ("short", "bench"):
        warned = [
            "flow.attention=triton needs a GPU" in "".join(p.read_text() for p in (work / folder).rglob("*.log"))
            for folder in (text, f"{text}-compared")
        ]
        assert warned == [False, True], text


@pytest.mark.cosyvoice
def test_the_part_account_counts_each_parts_work_against_the_machines_rates(tmp_path):
    """bench/part_account.py on a tiny v1: every part timed and counted; a decode step reads the LLM's
    weights once whatever its rows, so its bytes grow by the rows' caches alone while its operations
    double with the rows; a flow pass of twice the rows does twice the work."""
    need("cosyvoice", "cosyvoice")
    out = tmp_path / "account.json"
    figures = bench_figures(
        "part_account.py",
        ["--size", "tiny", "--decode-rows", "2,4", "--prefill-rows", "1,2", "--flow-rows", "2,4", "--seconds", "0.5"]
        + ["--repeat", "1"],
        out,
    )
    assert figures["machine"]["bf16_matmul_tflops"] > 0 and figures["machine"]["copy_gbps"] > 0
    for part in ("decode", "prefill", "flow", "vocoder"):
        assert len(figures[part]) == 2 and all(f["ms"] > 0 and f["flop"] > 0 for f in figures[part]), part
    two, four = figures["decode"]
    assert two["weights_mb"] == four["weights_mb"] > 0
    assert four["flop"] == pytest.approx(2 * two["flop"], rel=0.05)
    assert two["weights_mb"] < two["mb_read"] < four["mb_read"]
    one, double = figures["flow"]
    assert double["flop"] == pytest.approx(2 * one["flop"], rel=0.05)
