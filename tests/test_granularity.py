"""Work comes in pieces of shards: a one-shard job keeps every worker busy to the end, and a kill
mid-piece loses nothing.

The voice here is tests/paced_backend.py: a fixed wait per utterance and a real tone, so four
workers can overlap on a 2-core machine the way GPU workers do (Piper would need a core each).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import orjson
import pytest

from conftest import (
    REPO,
    assert_complete,
    llava_conversations,
    read_jsonl,
    read_jsonl_tolerant,
    run_all,
    script_env,
    wait_for,
    write_input,
)

PACED = ("--set", "tts.backend=paced_backend:PacedTone", "--set", "shards.segments_per_shard=200")
UTTERANCE_SECONDS = 0.3

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def hundred_segments(tmp_path_factory) -> Path:
    """Nine real conversations: about a hundred segments, one shard of capacity 200."""
    return write_input(tmp_path_factory.mktemp("input") / "convs.json", llava_conversations(9))


def paced_run(source: Path, out: Path, log: Path, workers: int, *more, env=None) -> subprocess.CompletedProcess:
    return run_all(
        "--input",
        source,
        "--output-dir",
        out,
        "--log-dir",
        log,
        "--gpus",
        "cpu:1",
        "--workers",
        workers,
        *PACED,
        *more,
        env=env or script_env(CONVTTS_TEST_UTTERANCE_SECONDS=UTTERANCE_SECONDS),
    )


def busy_intervals(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """Per worker: from the start of its first utterance to the end of its last, from manifest rows."""
    spans: dict[str, list[float]] = {}
    for row in rows:
        start, end = row["finished"] - row["synthesis_seconds"], row["finished"]
        span = spans.setdefault(row["worker"], [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    return {worker: (a, b) for worker, (a, b) in spans.items()}


def slot_log(log: Path) -> str:
    return "\n".join(p.read_text() for p in log.rglob("slot-0.log"))


def test_one_shard_keeps_four_workers_busy(tmp_path, hundred_segments):
    four, one = tmp_path / "four", tmp_path / "one"
    result = paced_run(hundred_segments, four, tmp_path / "log4", workers=4)
    assert result.returncode == 0, result.stderr
    rows = assert_complete(four)
    assert 80 <= len(rows) <= 130 and len(list((four / "plan" / "shards").glob("shard-?????.jsonl"))) == 1
    started = re.search(
        r"(\d+) utterances? to do in 1 of 1 shard, cut into about (\d+) pieces?.*; (\d+) workers?",
        slot_log(tmp_path / "log4"),
    )
    assert started and int(started[1]) == len(rows) and int(started[2]) >= 8 and int(started[3]) == 4

    # Each of the four spoke a fair share, they worked at the same time, and all were still at it
    # near the end: the last pieces are small, so nobody finishes long before the others.
    shares = Counter(r["worker"] for r in rows)
    assert len(shares) == 4, shares
    assert all(0.10 * len(rows) <= n <= 0.40 * len(rows) for n in shares.values()), shares
    intervals = busy_intervals(rows)
    first_end, last_start = min(b for _, b in intervals.values()), max(a for a, _ in intervals.values())
    assert last_start < first_end, "some worker started only after another had finished"
    begin, end = min(a for a, _ in intervals.values()), max(b for _, b in intervals.values())
    assert all(b >= begin + 0.75 * (end - begin) for _, b in intervals.values()), "a worker went idle early"
    stats = orjson.loads((four / "work" / "shard-00000.stats.json").read_bytes())
    assert stats["done"] == len(rows) and stats["failed"] == 0 and stats["pieces"] >= 8

    # The same job on one worker: four take well under half its time (a quarter, less start-up,
    # on an idle machine). The span is measured from the rows, so start-up and merge do not count.
    result = paced_run(hundred_segments, one, tmp_path / "log1", workers=1)
    assert result.returncode == 0, result.stderr
    alone = busy_intervals(assert_complete(one))
    assert list(alone) == ["slot0-w0"]
    assert end - begin < 0.5 * (alone["slot0-w0"][1] - alone["slot0-w0"][0])


def test_few_utterances_keep_no_idle_workers(tmp_path):
    records = llava_conversations(1)
    records[0]["conversations"] = records[0]["conversations"][:2]
    records[0]["conversations"][1]["value"] = "Two zebras graze."
    source = write_input(tmp_path / "in.json", records)
    result = paced_run(source, tmp_path / "out", tmp_path / "log", workers=4)
    assert result.returncode == 0, result.stderr
    rows = assert_complete(tmp_path / "out")
    assert 2 <= len(rows) < 4
    assert f"keeping {len(rows)} of 4 workers: no more than utterances to do" in slot_log(tmp_path / "log")


def test_sigkill_slot_mid_piece_then_rerun_with_other_worker_count(tmp_path, hundred_segments):
    out, log = tmp_path / "out", tmp_path / "log"
    run = subprocess.Popen(
        [
            "bash",
            str(REPO / "run_all.sh"),
            "--input",
            str(hundred_segments),
            "--output-dir",
            str(out),
            "--log-dir",
            str(log),
            "--gpus",
            "cpu:1",
            "--workers",
            "4",
            *PACED,
        ],
        env=script_env(CONVTTS_TEST_UTTERANCE_SECONDS=UTTERANCE_SECONDS),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )

    def manifests() -> list[Path]:
        return list((out / "work").glob("shard-00000.w*.manifest.jsonl"))

    def spoken() -> list[dict]:
        return [r for p in manifests() for r in read_jsonl_tolerant(p)]

    wait_for(lambda: (out / "work").is_dir() and len(manifests()) == 4 and len(spoken()) >= 30)
    os.kill(slot_pid(run.pid), signal.SIGKILL)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1, stderr.decode()  # a slot died: not everything was spoken
    assert not (out / "work" / "shard-00000.stats.json").exists(), "a half-done shard was marked done"
    before = {r["id"]: r for r in spoken()}
    stamps = {uid: (out / r["audio"]).stat().st_mtime_ns for uid, r in before.items()}
    assert 30 <= len(before) < len(read_jsonl(out / "plan" / "shards" / "shard-00000.jsonl"))

    again = paced_run(hundred_segments, out, log, workers=3)
    assert again.returncode == 0, again.stderr
    rows = {r["id"]: r for r in assert_complete(out)}
    for uid, row in before.items():  # finished work was kept, not redone
        assert rows[uid]["run"] == row["run"] and (out / row["audio"]).stat().st_mtime_ns == stamps[uid]
    redone = Counter(r["worker"] for r in rows.values() if r["run"] != next(iter(before.values()))["run"])
    assert len(redone) == 3, redone  # the rerun's three workers shared the rest of the one shard


def slot_pid(group: int) -> int:
    """The parallel_cosyvoice.py process of a run started in its own process group."""
    for proc in Path("/proc").iterdir():
        try:
            same_group = proc.name.isdigit() and os.getpgid(int(proc.name)) == group
            if same_group and b"parallel_cosyvoice.py" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except (OSError, ProcessLookupError):
            continue
    raise AssertionError("no slot process found")


def spans_of(rows: list[dict], worker: str) -> list[tuple[float, float]]:
    return sorted((r["finished"] - r["synthesis_seconds"], r["finished"]) for r in rows if r["worker"] == worker)


def test_an_idle_worker_takes_over_what_a_slow_one_has_not_begun(tmp_path, hundred_segments):
    """One worker speaks eight times slower than the other three: once they run out of pieces they
    take over the ids it holds and has not begun, so it finishes close to them, not a piece later."""
    out, log = tmp_path / "out", tmp_path / "log"
    env = script_env(
        CONVTTS_TEST_UTTERANCE_SECONDS=UTTERANCE_SECONDS,
        CONVTTS_TEST_SLOW_WORKER="slot0-w0",
        CONVTTS_TEST_SLOW_FACTOR=8,
    )
    result = run_all(
        "--input",
        hundred_segments,
        "--output-dir",
        out,
        "--log-dir",
        log,
        "--gpus",
        "cpu:1",
        "--workers",
        4,
        *PACED,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)
    assert re.search(r"worker 0 handed back \d+ utterances it had not begun", slot_log(log)), slot_log(log)
    slow = UTTERANCE_SECONDS * 8
    ends = {worker: b for worker, (_, b) in busy_intervals(rows).items()}
    others = max(b for worker, b in ends.items() if worker != "slot0-w0")
    assert ends["slot0-w0"] - others <= 2 * slow + 1.0, ends  # without the hand-back: about 8 slow utterances
    assert Counter(r["worker"] for r in rows)["slot0-w0"] < 0.15 * len(rows)


def slow_batched_env() -> dict:
    """Workers of 4 rows (tests/paced_backend.py PacedBatchTone), the second three times slower."""
    return script_env(
        CONVTTS_TEST_UTTERANCE_SECONDS=0.3,
        CONVTTS_TEST_ROWS=4,
        CONVTTS_TEST_SLOW_WORKER="slot0-w1",
        CONVTTS_TEST_SLOW_FACTOR=3,
    )


def test_batched_rows_stay_full_across_pieces_and_the_tail_is_short(tmp_path, hundred_segments):
    """A batched voice of 4 rows (tests/paced_backend.py PacedBatchTone, one slow worker): each worker
    asks for its next piece before its rows run dry, so they stay full across pieces and shards,
    and the two end within about one utterance of each other."""
    out, log = tmp_path / "out", tmp_path / "log"
    env = slow_batched_env()
    result = run_all(
        "--input",
        hundred_segments,
        "--output-dir",
        out,
        "--log-dir",
        log,
        "--gpus",
        "cpu:1",
        "--workers",
        2,
        "--set",
        "tts.backend=paced_backend:PacedBatchTone",
        "--set",
        "shards.segments_per_shard=20",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)
    assert len(list((out / "plan" / "shards").glob("shard-?????.jsonl"))) >= 5
    text = slot_log(log)
    assert "of 4 rows each" in text, text
    longest = max(r["synthesis_seconds"] for r in rows)
    for worker in ("slot0-w0", "slot0-w1"):  # rows in flight, sampled from its first batch's end (its rows
        spans = spans_of(rows, worker)  # decode to their end undisturbed: hold_first_batch) until its last began
        begin, end = first_batch_end(spans, 4) + 0.5, max(a for a, _ in spans) - longest
        live = [sum(a <= t < b for a, b in spans) for t in [begin + 0.05 * i for i in range(int((end - begin) / 0.05))]]
        # a row is free only for the moment between an utterance's end and the next one's start; two
        # rows may end together on a busy machine, but rows that drain before the next piece go to 1 or 0
        short = sum(n < 3 for n in live)
        assert len(live) > 40 and min(live) >= 2 and short <= max(2, len(live) // 20), (worker, live)
        assert sum(live) / len(live) >= 3.8, (worker, live)
    ends = [max(b for _, b in spans_of(rows, worker)) for worker in ("slot0-w0", "slot0-w1")]
    assert abs(ends[0] - ends[1]) <= longest + 0.5, (ends, longest)


def first_batch_end(spans: list[tuple[float, float]], rows: int) -> float:
    """When the last of a worker's first `rows` utterances (by start) finished."""
    return max(end for _, end in spans[:rows])


def one_long_turn(count: int) -> list[dict]:
    """`count` conversations of two eight-word turns, but the first one's question has 23 words (one
    segment, about three times a short one's time with the paced voice): the first worker's first rows
    are one long, three short."""
    short = "The man is riding a red bicycle downhill."
    long = (
        "Could you describe what the person in this picture is doing with the red bicycle"
        " on the hill behind the old house today?"
    )
    return [
        {
            "id": f"c{i}",
            "conversations": [{"from": "human", "value": long if i == 0 else short}, {"from": "gpt", "value": short}],
        }
        for i in range(count)
    ]


@pytest.mark.parametrize("hold", [True, False])
def test_a_batched_worker_speaks_its_first_rows_to_their_end_before_it_takes_more(tmp_path, hold):
    """workers.hold_first_batch with hold_release 1.0: a worker's first rows (the job's longest ids) decode
    with no row refilled beside them, so nothing of the worker begins before the last of them ends; off, a
    row freed by a short utterance takes a new id at once, while the long one still decodes."""
    source = write_input(tmp_path / "convs.json", one_long_turn(12))
    out, log = tmp_path / "out", tmp_path / "log"
    env = script_env(CONVTTS_TEST_UTTERANCE_SECONDS=0.3, CONVTTS_TEST_ROWS=4)
    more = (
        "--set",
        "tts.backend=paced_backend:PacedBatchTone",
        "--set",
        f"workers.hold_first_batch={str(hold).lower()}",
        "--set",
        "workers.hold_release=1.0",
    )
    result = paced_run(source, out, log, 2, *more, env=env)
    assert result.returncode == 0, result.stderr
    spans = both_workers_spans(assert_complete(out))
    early = {worker: begun_beside_first_batch(each) for worker, each in spans.items()}
    assert (not any(early.values())) if hold else any(early.values()), early


def both_workers_spans(rows: list[dict]) -> dict[str, list]:
    """Each of the two workers' spans, more than its first batch of four in each."""
    spans = {worker: spans_of(rows, worker) for worker in ("slot0-w0", "slot0-w1")}
    for each in spans.values():
        assert len(each) > 4, each
    return spans


def begun_beside_first_batch(spans: list) -> list[float]:
    """When the rows after a worker's first four began, where that was before the first four all ended."""
    return [a for a, _ in spans[4:] if a < first_batch_end(spans, 4) - 0.05]


def test_a_first_batch_released_at_half_refills_once_half_of_it_is_back(tmp_path):
    """workers.hold_release=0.5: a worker's first four rows decode with nothing refilled until two of them
    have come back; from then on freed rows take new ids while the long one still decodes."""
    source = write_input(tmp_path / "convs.json", one_long_turn(12))
    out, log = tmp_path / "out", tmp_path / "log"
    env = script_env(CONVTTS_TEST_UTTERANCE_SECONDS=0.3, CONVTTS_TEST_ROWS=4)
    more = ("--set", "tts.backend=paced_backend:PacedBatchTone", "--set", "workers.hold_release=0.5")
    result = paced_run(source, out, log, 2, *more, env=env)
    assert result.returncode == 0, result.stderr
    early = {}
    for worker, spans in both_workers_spans(assert_complete(out)).items():
        half_back = sorted(end for _, end in spans[:4])[1]
        assert all(a >= half_back - 0.01 for a, _ in spans[4:]), (worker, half_back, spans)
        early[worker] = begun_beside_first_batch(spans)
    assert any(early.values()), early  # the worker with the long row refilled beside it


@pytest.mark.parametrize("deal", [True, False])
def test_dealt_first_batches_give_the_longest_rows_to_different_workers(tmp_path, deal):
    """workers.deal_first_batch: the job's two long rows begin in the two workers' first batches, one
    each; without it the first worker to ask takes both (its first piece is the four longest ids)."""
    conversations = one_long_turn(12)
    conversations[1]["conversations"][0]["value"] = conversations[0]["conversations"][0]["value"]
    source = write_input(tmp_path / "convs.json", conversations)
    out, log = tmp_path / "out", tmp_path / "log"
    env = script_env(CONVTTS_TEST_UTTERANCE_SECONDS=0.3, CONVTTS_TEST_ROWS=4)
    dealing = f"workers.deal_first_batch={str(deal).lower()}"
    more = ("--set", "tts.backend=paced_backend:PacedBatchTone", "--set", dealing)
    result = paced_run(source, out, log, 2, *more, env=env)
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)
    longest = sorted(rows, key=lambda row: -len(row["text"].split()))[:2]
    assert all(len(row["text"].split()) > 20 for row in longest)
    workers = {row["worker"] for row in longest}
    assert len(workers) == (2 if deal else 1), [(row["id"], row["worker"]) for row in longest]


def test_a_batched_worker_holds_few_ids_it_cannot_begin(tmp_path, hundred_segments):
    """A batched worker asks for its free rows and one id more: the rest wait in the slot, longest
    first, so a slow worker never sits on long ids while a fast one begins shorter ones (one shard:
    the whole job is one longest-first window)."""
    out, log = tmp_path / "out", tmp_path / "log"
    env = slow_batched_env()
    result = paced_run(hundred_segments, out, log, 2, "--set", "tts.backend=paced_backend:PacedBatchTone", env=env)
    assert result.returncode == 0, result.stderr
    rows = assert_complete(out)
    # each worker's 4 rows and the 1 id more it may hold, and one piece of 2 that came meanwhile
    assert shorter_begun_before(out, rows) <= 2 * (4 + 1 + 2), slot_log(log)


def shorter_begun_before(out: Path, rows: list[dict]) -> int:
    """The most ids of fewer words that began before an id did (0 when they began longest first)."""
    words = {
        row["id"]: len(row["text"].split())
        for shard in (out / "plan" / "shards").glob("shard-?????.jsonl")
        for row in read_jsonl(shard)
    }
    begun = [(r["finished"] - r["synthesis_seconds"], words[r["id"]]) for r in rows]
    return max(sum(w < length and t < start - 0.05 for t, w in begun) for start, length in begun)
