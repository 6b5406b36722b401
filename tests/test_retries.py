"""The retry rule, in one process: attempts, re-speaks, out-of-memory rebuilds, a batch-wide error.

A real Worker (utterance.Host) speaks pieces of a real plan into a real output folder; its slot's end
of the pipe is read back. The voice is tests/scripted_backend.py: a tone, except where the script
makes a text fail; the quality gate is the real one, without its recogniser.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

from conftest import read_jsonl, write_input
from convtts.config import load_config
from convtts.gate.quality import take_seed
from convtts.plan.planner import make_plan
from convtts.run.batching import GROW_AFTER, run_batch
from convtts.run.messages import Built, Failed, Returned, SpeakPiece, Spoken, Started, Stop, Want
from convtts.run.pieces import WorkQueue, open_shard
from convtts.run.processes import Handle
from convtts.run.slot import Slot, SlotOptions
from convtts.run.worker import Worker, WorkerArgs
from convtts.state.layout import Layout
from convtts.state.shardio import load_done, load_failures
from scripted_backend import OOM_TEXT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from e2e import out_of_memory  # bench/ is not a package

SEED = 1234  # workers.seed's default
ZEBRA = "farm-001-00"  # the one segment whose text holds the script's word
CONVERSATION = {
    "id": "farm",
    "conversations": [
        {"from": "human", "value": "What animals are in the field today?"},
        {"from": "gpt", "value": "A zebra stands beside two brown horses."},
        {"from": "human", "value": "What is the weather like there?"},
        {"from": "gpt", "value": "The sky is clear and the grass is dry."},
        {"from": "human", "value": "Is anyone riding the horses?"},
        {"from": "gpt", "value": "No, they are grazing near the fence."},
    ],
}
IDS = [f"farm-{turn:03d}-00" for turn in range(6)]
# The order a shard's ids go out in: the longest first, ties in plan order (run/pieces.py)
HANDED = ["farm-003-00", "farm-000-00", "farm-001-00", "farm-005-00", "farm-002-00", "farm-004-00"]
ANIMALS = {0: "a zebra", 14: "a lion"}


@pytest.fixture
def tally(tmp_path, monkeypatch):
    folder = tmp_path / "tally"
    folder.mkdir()
    monkeypatch.setenv("CONVTTS_TEST_TALLY", str(folder))
    return folder


class Run:
    """A worker on a planned output, and what it told its slot."""

    def __init__(self, root, backend: str, *overrides: str, conversation: dict = CONVERSATION):
        self.config = load_config(
            None,
            [
                f"tts.backend=scripted_backend:{backend}",
                "validate.enabled=true",
                "validate.recogniser=none",
                *overrides,
            ],
        )
        self.layout = Layout(root / "out")
        make_plan(write_input(root / "in.json", [conversation]), self.layout, self.config, workers=1)
        self.shard = self.layout.shard_names()[0]
        self.layout.work_dir.mkdir()  # as the slot does before a worker speaks (its progress file is there)
        open_shard(self.layout, self.shard, "run1")
        self.inbox, pipe = multiprocessing.Pipe()
        self.worker = Worker(WorkerArgs(0, 0, str(self.layout.root), self.config, "run1", os.getpid()), pipe)
        self.worker.build("start")

    def speak(self, ids=IDS, crashes: dict | None = None) -> None:
        self.worker.run_piece(SpeakPiece(self.shard, list(ids), crashes or {}))

    def messages(self) -> list:
        said = []
        while self.inbox.poll():
            said.append(self.inbox.recv())
        return said

    def rows(self) -> dict[str, dict]:
        return load_done(self.layout, self.shard)

    def failures(self) -> dict[str, dict]:
        return load_failures(self.layout, self.shard)


def calls(tally, text_word: str = "zebra") -> list[dict]:
    return [c for c in read_jsonl(tally / "calls.jsonl") if text_word in c["text"]]


def run(tmp_path, monkeypatch, script: str, backend: str = "ScriptedTone", *overrides: str, **kwargs) -> Run:
    monkeypatch.setenv("CONVTTS_TEST_SCRIPT", script)
    return Run(tmp_path, backend, *overrides, **kwargs)


# -- one at a time ----------------------------------------------------------------------------------


def test_an_error_is_tried_again_with_the_same_seed_until_it_succeeds(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=error:2")
    worker.speak()
    rows = worker.rows()
    assert sorted(rows) == IDS and worker.failures() == {}
    assert rows[ZEBRA]["attempts"] == 3 and rows[ZEBRA]["seed"] == take_seed(SEED, ZEBRA, 0)
    assert [c["seed"] for c in calls(tally)] == [take_seed(SEED, ZEBRA, 0)] * 3  # the same take, tried again
    assert all(rows[uid]["attempts"] == 1 for uid in IDS if uid != ZEBRA)
    said = worker.messages()
    assert isinstance(said[-1], Spoken) and sum(isinstance(m, Started) for m in said) == 6
    assert not any(isinstance(m, Want) for m in said)  # a piece spoken by hand asks the slot for nothing


def test_errors_past_max_attempts_leave_a_failure_row_and_the_piece_goes_on(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=error:all", "ScriptedTone", "workers.max_attempts=3")
    worker.speak()
    assert sorted(worker.rows()) == [uid for uid in IDS if uid != ZEBRA]
    failure = worker.failures()[ZEBRA]
    assert failure["status"] == "failed" and failure["attempts"] == 3 and len(failure["errors"]) == 3
    assert failure["reason"].startswith("SynthesisError: scripted error")
    assert failure["backend"] == "scripted_backend:ScriptedTone"
    assert len(calls(tally)) == 3
    assert [m.uid for m in worker.messages() if isinstance(m, Failed)] == [ZEBRA]


def test_deaths_of_a_worker_count_as_attempts(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=error:all", "ScriptedTone", "workers.max_attempts=3")
    worker.speak([ZEBRA], crashes={ZEBRA: 1})
    failure = worker.failures()[ZEBRA]
    assert len(calls(tally)) == 2 and failure["attempts"] == 3  # one death and two errors
    assert failure["errors"][0] == "worker process died while speaking it (1x)"

    worker.speak([ZEBRA], crashes={ZEBRA: 3})  # attempts used up by deaths: not tried again
    assert len(calls(tally)) == 2
    assert worker.failures()[ZEBRA]["errors"] == ["worker process died while speaking it (3x)"]


def test_a_refused_take_is_spoken_again_with_the_next_seed_without_costing_an_attempt(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=silent:1")
    worker.speak()
    row = worker.rows()[ZEBRA]
    assert row["attempts"] == 1 and row["respeaks"] == 1 and row["respoken_for"] == ["silence 1 > 0.6"]
    assert row["seed"] == take_seed(SEED, ZEBRA, 1)
    assert [c["seed"] for c in calls(tally)] == [take_seed(SEED, ZEBRA, 0), take_seed(SEED, ZEBRA, 1)]


def refused_every_time(tmp_path, monkeypatch, tally, backend: str, policy: str) -> Run:
    """A worker whose every take of ZEBRA the gate refuses (silence), under validate.on_fail=policy."""
    settings = ("validate.max_respeaks=2", f"validate.on_fail={policy}")
    worker = run(tmp_path, monkeypatch, "zebra=silent:all", backend, *settings)
    worker.speak()
    assert [c["seed"] for c in calls(tally)] == [take_seed(SEED, ZEBRA, take) for take in range(3)]
    return worker


@pytest.mark.parametrize("backend", ["ScriptedTone", "ScriptedBatchTone"])
def test_a_take_refused_every_time_fails_on_the_gates_check_under_fail(tmp_path, monkeypatch, tally, backend):
    worker = refused_every_time(tmp_path, monkeypatch, tally, backend, "fail")
    failure = worker.failures()[ZEBRA]
    assert failure["status"] == "failed" and failure["check"] == "silence" and failure["respeaks"] == 2
    assert failure["attempts"] == 1 and ZEBRA not in worker.rows()
    assert not (worker.layout.audio_dir(worker.shard) / f"{ZEBRA}.wav").exists()  # nothing refused is written
    assert any(isinstance(m, Failed) and m.uid == ZEBRA for m in worker.messages())


@pytest.mark.parametrize("backend", ["ScriptedTone", "ScriptedBatchTone"])
def test_a_take_refused_every_time_is_written_and_marked_under_keep(tmp_path, monkeypatch, tally, backend):
    worker = refused_every_time(tmp_path, monkeypatch, tally, backend, "keep")
    row = worker.rows()[ZEBRA]  # its audio is whole: load_done opened it
    assert row["status"] == "gate-refused-kept" and row["seed"] == take_seed(SEED, ZEBRA, 2)
    assert row["refused"] == {"reason": "silence 1 > 0.6", "check": "silence", "figure": 1.0, "limit": 0.6}
    assert row["respeaks"] == 2 and row["respoken_for"] == ["silence 1 > 0.6"] * 2
    assert row["quality"]["silence"] == 1
    assert ZEBRA not in worker.failures()
    assert any(isinstance(m, Spoken) and m.uid == ZEBRA and m.audio_seconds > 0 for m in worker.messages())


@pytest.mark.parametrize("backend", ["ScriptedTone", "ScriptedBatchTone"])
def test_a_take_refused_every_time_is_settled_without_audio_under_drop(tmp_path, monkeypatch, tally, backend):
    worker = refused_every_time(tmp_path, monkeypatch, tally, backend, "drop")
    row = worker.rows()[ZEBRA]  # a manifest row: a rerun counts the id as settled
    assert row["status"] == "dropped" and row["check"] == "silence" and row["respeaks"] == 2
    assert row["quality"]["silence"] == 1 and ZEBRA not in worker.failures()
    assert not list(worker.layout.audio_root.rglob(f"{ZEBRA}.*"))
    assert open_shard(worker.layout, worker.shard, "run2").pending.count(ZEBRA) == 0


def test_out_of_memory_rebuilds_the_model_then_tries_again(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=oom:1")
    worker.speak()
    assert worker.rows()[ZEBRA]["attempts"] == 2
    assert [m.reason for m in worker.messages() if isinstance(m, Built)] == ["start", "out of GPU memory"]
    first, second = calls(tally)
    assert second["build"] == first["build"] + 1  # the second try ran on the new model


def test_a_full_disk_stops_the_piece_and_records_no_failure(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=full:all")
    with pytest.raises(OSError) as stopped:
        worker.speak()
    assert stopped.value.errno == errno.ENOSPC and len(calls(tally)) == 1  # no utterance is at fault: no retry
    assert sorted(worker.rows()) == IDS[:1] and worker.failures() == {}


# -- batched ----------------------------------------------------------------------------------------


def paths(tally) -> dict[str, list[str]]:
    """The paths the calls of each text took (one | many), by text."""
    taken: dict[str, list[str]] = {}
    for call in read_jsonl(tally / "calls.jsonl"):
        if call["path"] != "build":
            taken.setdefault(call["text"], []).append(call["path"])
    return taken


def test_a_batch_tries_a_failed_utterance_again_in_a_later_batch(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=error:1", "ScriptedBatchTone")
    worker.speak()
    rows = worker.rows()
    assert sorted(rows) == IDS and rows[ZEBRA]["attempts"] == 2
    assert [c["path"] for c in calls(tally)] == ["many", "many"]
    assert all(taken == ["many"] for text, taken in paths(tally).items() if "zebra" not in text)


def test_out_of_memory_in_a_batch_halves_the_rows_and_retries_what_was_in_flight(tmp_path, monkeypatch, tally):
    monkeypatch.setenv("CONVTTS_TEST_ROWS", "4")
    worker = run(tmp_path, monkeypatch, "zebra=oom:1", "ScriptedBatchTone")
    worker.speak()
    rows = worker.rows()
    assert sorted(rows) == IDS and worker.worker.backend.batch_rows == 2
    # The first batch of four held the zebra: all four were in flight, none was written, each is
    # charged an attempt and spoken again in batches of two; the two after them were never touched.
    assert [rows[uid]["attempts"] for uid in IDS] == [2, 2, 2, 2, 1, 1]
    assert [c["path"] for c in calls(tally)] == ["many", "many"]


def test_out_of_memory_in_a_batch_logs_one_warning_and_keeps_each_error(tmp_path, monkeypatch, tally, caplog):
    """One warning line for the batch, the error cut to its first sentence; each utterance's own list
    (its failure row, once its attempts run out) keeps the whole error, logged per id at debug level."""
    monkeypatch.setenv("CONVTTS_TEST_ROWS", "4")
    caplog.set_level(logging.DEBUG, logger="convtts")
    worker = run(tmp_path, monkeypatch, "zebra=oom:1", "ScriptedBatchTone", "workers.max_attempts=1")
    worker.speak()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [
        "out of memory with 4 utterances in flight (CUDA out of memory (scripted).); now 2 rows, each tried again"
    ]
    assert out_of_memory(["\n".join(warned)]) == 1  # what bench/e2e.py counts in a worker's log
    failures = worker.failures()
    assert sorted(failures) == sorted(IDS[:4]) and sorted(worker.rows()) == IDS[4:]
    assert all(f["errors"] == [f"OutOfMemory: {OOM_TEXT}"] for f in failures.values())
    debug = [
        r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "attempt 1/1 failed" in r.getMessage()
    ]
    assert len(debug) == 4


def test_utterances_keep_their_attempts_when_the_rows_fall_to_one_and_the_rows_grow_back(
    tmp_path, monkeypatch, tally, caplog
):
    """Rows cut to one speak one at a time; once GROW_AFTER utterances are through without running out of
    memory, the rows double again and the two ids that ran out are spoken in a batch."""
    monkeypatch.setenv("CONVTTS_TEST_ROWS", "2")
    caplog.set_level(logging.INFO, logger="convtts")
    worker = run(tmp_path, monkeypatch, "zebra=oom:1", "ScriptedBatchTone")
    worker.speak()
    rows = worker.rows()
    assert sorted(rows) == IDS and rows[ZEBRA]["attempts"] == 2  # the out-of-memory cost it one, as with rows to spare
    assert GROW_AFTER == 4 and [paths(tally)[rows[uid]["text"]] for uid in IDS] == [
        ["many", "many"],  # in the batch that ran out, then in the batch of two rows once they grew back
        ["many", "many"],
        ["one"],  # the four after them, one at a time: rows of one times GROW_AFTER
        ["one"],
        ["one"],
        ["one"],
    ]
    assert "4 utterances finished without running out of memory; rows 1 -> 2 of 2" in caplog.messages
    assert worker.worker.backend.batch_rows == 2


# Forty short turns: a zebra runs the first batch out of memory, a lion the first batch after the rows grew
SAFARI = {
    "id": "safari",
    "conversations": [
        {"from": "human" if turn % 2 == 0 else "gpt", "value": f"Turn {turn} sees {ANIMALS.get(turn, 'a bird')}."}
        for turn in range(40)
    ],
}


def test_rows_grow_back_and_an_out_of_memory_after_a_growth_doubles_the_wait(tmp_path, monkeypatch, tally, caplog):
    """Four rows: the zebra's batch runs out and the rows halve; eight utterances (two rows times
    GROW_AFTER) later they are four again; the lion's batch runs out at four, so the rows halve and the
    next growth waits twice as long, sixteen utterances. Nothing is lost on the way."""
    monkeypatch.setenv("CONVTTS_TEST_ROWS", "4")
    caplog.set_level(logging.INFO, logger="convtts")
    worker = run(tmp_path, monkeypatch, "zebra=oom:1,lion=oom:1", "ScriptedBatchTone", conversation=SAFARI)
    worker.speak([f"safari-{turn:03d}-00" for turn in range(40)])
    assert len(worker.rows()) == 40 and worker.failures() == {}
    changes = [m for m in caplog.messages if "rows" in m and ("out of memory with" in m or " -> " in m)]
    assert changes == [
        "out of memory with 4 utterances in flight (CUDA out of memory (scripted).); now 2 rows, each tried again",
        "8 utterances finished without running out of memory; rows 2 -> 4 of 4",
        "out of memory with 4 utterances in flight (CUDA out of memory (scripted).); now 2 rows, each tried again",
        "16 utterances finished without running out of memory; rows 2 -> 4 of 4",
    ]
    assert worker.worker.backend.batch_rows == 4


def test_a_first_batch_of_ids_a_worker_died_on_ends_the_hold_once_spoken(tmp_path, monkeypatch, tally):
    """workers.hold_first_batch: a worker whose first ids are all ones a worker died on speaks them alone,
    outside any batch; with them spoken it holds nothing, so its hold ends and it asks for more (a hold
    that outlived them would leave it asking for nothing, forever)."""
    worker = run(tmp_path, monkeypatch, "", "ScriptedBatchTone")
    host = worker.worker
    host.holding = True  # as serve() starts a batched worker
    host.take(SpeakPiece(worker.shard, IDS[:3], {uid: 1 for uid in IDS[:3]}))
    assert host.held() and len(host.alone) == 3  # its rows' worth of ids: it asks for nothing while they last
    worker.inbox.send(Stop())  # the slot's answer to the ask that follows, so that the worker does not wait
    host.speak_some()
    assert sorted(worker.rows()) == IDS[:3] and not host.holding
    assert any(isinstance(m, Want) for m in worker.messages())


def test_a_batch_wide_error_is_spoken_one_at_a_time_and_loses_nothing(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=broken:1", "ScriptedBatchTone")
    worker.speak()
    rows = worker.rows()
    assert sorted(rows) == IDS and worker.failures() == {}
    in_flight, later = IDS[:3], IDS[3:]
    taken = paths(tally)
    assert all(taken[text][-1] == "one" for text in _texts(worker, in_flight))
    assert all(rows[uid]["attempts"] == 2 for uid in in_flight)  # the broken batch counted as an attempt
    assert all(taken[text] == ["many"] for text in _texts(worker, later))  # then batches again


def test_an_utterance_that_killed_a_worker_is_spoken_alone(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "", "ScriptedBatchTone")
    worker.speak(crashes={ZEBRA: 1})
    rows = worker.rows()
    assert sorted(rows) == IDS and rows[ZEBRA]["attempts"] == 2
    assert [c["path"] for c in calls(tally)] == ["one"]
    assert all(taken == ["many"] for text, taken in paths(tally).items() if "zebra" not in text)


def test_a_refused_take_in_a_batch_is_spoken_again_with_its_next_seed(tmp_path, monkeypatch, tally):
    worker = run(tmp_path, monkeypatch, "zebra=silent:1", "ScriptedBatchTone")
    worker.speak()
    row = worker.rows()[ZEBRA]
    assert row["respeaks"] == 1 and row["attempts"] == 1 and row["seed"] == take_seed(SEED, ZEBRA, 1)
    assert [(c["path"], c["seed"]) for c in calls(tally)] == [("many", take_seed(SEED, ZEBRA, t)) for t in range(2)]


def _texts(run: Run, ids: list[str]) -> list[str]:
    segments = run.worker.segments(run.shard)
    return [segments[uid]["text"] for uid in ids]


def test_ids_waiting_to_be_tried_again_are_handed_back_with_their_errors(tmp_path, monkeypatch, tally):
    """After an out-of-memory the ids of its batch wait in the worker's queue: the worker tells its slot,
    which counts them as not begun again, so a HandBack takes them like any queued id. They go with the
    errors of the attempts they spent, and the worker that speaks them next counts on from there."""
    monkeypatch.setenv("CONVTTS_TEST_ROWS", "4")
    first = run(tmp_path, monkeypatch, "zebra=oom:1", "ScriptedBatchTone")
    host, layout, shard = first.worker, first.layout, first.shard
    slot = Slot(layout, first.config, lambda: [shard], SlotOptions(0, 2, "run1"))
    slot.work = WorkQueue(layout, [shard], "run1", workers=1)
    pieces = [slot.work.next_piece(), slot.work.next_piece()]  # as a slot fills a batched worker's room
    handle = Handle(0, None, None, ready=True, pieces=list(pieces))
    assert [uid for piece in pieces for uid in piece.ids] == HANDED  # the zebra (farm-001-00) is in the first four

    host.asking = False  # this test is its slot
    for piece in pieces:
        host.take(SpeakPiece(shard, piece.ids, {}))
    run_batch(host, host.queue)  # the first four run out of memory and go back in line
    for message in first.messages():
        slot.on_message(handle, message)
    assert handle.unstarted() == len(IDS)  # the four that wait count as not begun

    host.hand_back(3)  # as the slot asks for an idle worker: from the end of the queue
    said = first.messages()
    back = set(HANDED[1:4])
    assert [type(m) for m in said] == [Returned] and set(said[0].ids) == back
    assert said[0].errors == dict.fromkeys(back, (f"OutOfMemory: {OOM_TEXT}",))
    slot.on_message(handle, said[0])
    again = slot.work.next_piece()
    assert set(again.ids) == back and again.errors == said[0].errors  # first in line, errors and all

    pipe, other_end = multiprocessing.Pipe()
    second = Worker(WorkerArgs(1, 0, str(layout.root), first.config, "run1", os.getpid()), other_end)
    second.build("start")
    second.run_piece(SpeakPiece(shard, again.ids, again.crashes, again.errors))
    while host.queue:
        host.speak_some()
    rows = first.rows()
    assert sorted(rows) == IDS and {uid: rows[uid]["worker"] for uid in back} == dict.fromkeys(back, "slot0-w1")
    assert {uid: rows[uid]["attempts"] for uid in IDS} == {**dict.fromkeys(IDS, 1), **dict.fromkeys(HANDED[:4], 2)}
