"""A slot whose workers die: the deaths charged to the ids in flight, the rest handed back, the
workers started again, and a slot that gives up when its workers die before speaking anything.

A real Slot runs in the test process and spawns real workers (about half a second each); their voice
is tests/scripted_backend.py, which kills its worker with SIGKILL where the script says.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time

import pytest

from conftest import alive, read_jsonl, write_input
from convtts import EXIT_FAILURES, EXIT_OK
from convtts.config import load_config
from convtts.plan.planner import make_plan
from convtts.run.feed import ShardFeed, wait_seconds
from convtts.run.pieces import Piece
from convtts.run.processes import Handle
from convtts.run.slot import MAX_BARREN_DEATHS, Slot, SlotOptions
from convtts.state.layout import Layout
from convtts.state.shardio import load_done, load_failures, read_json

SHARD = "shard-00000"
ZEBRA = "farm-001-00"
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
# The order a shard's ids go out in: the longest first, ties in plan order (run/pieces.py); 9, 7, 7, 7, 6, 5 words
HANDED = ["farm-003-00", "farm-000-00", "farm-001-00", "farm-005-00", "farm-002-00", "farm-004-00"]


@pytest.fixture
def slot_run(tmp_path, monkeypatch, caplog):
    """run(script, workers, *overrides) plans the conversation and runs a slot on it; returns its exit code."""
    tally = tmp_path / "tally"
    tally.mkdir()
    monkeypatch.setenv("CONVTTS_TEST_TALLY", str(tally))  # the spawned workers inherit the environment
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # the slot installs its own
    caplog.set_level(logging.INFO, logger="convtts")
    layout = Layout(tmp_path / "out")

    def run(script: str, workers: int, backend: str = "ScriptedTone", *overrides: str) -> int:
        monkeypatch.setenv("CONVTTS_TEST_SCRIPT", script)
        config = load_config(None, [f"tts.backend=scripted_backend:{backend}", *overrides])
        make_plan(write_input(tmp_path / "in.json", [CONVERSATION]), layout, config, workers=1)
        shards = layout.shard_names()
        slot = Slot(layout, config, lambda: shards, SlotOptions(0, workers, "run1", str(tmp_path / "log")))
        code = slot.run()
        assert not slot.handles or not any(alive(h.proc.pid) for h in slot.handles.values())
        return code

    run.layout, run.tally = layout, tally
    yield run
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def deaths(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if " died (exit " in r.getMessage()]


def test_a_worker_killed_mid_piece_costs_the_utterance_one_attempt_and_loses_nothing(slot_run, caplog):
    assert slot_run("zebra=kill:1", workers=2) == EXIT_OK
    layout = slot_run.layout
    crashes = read_jsonl(layout.crashes(SHARD))
    assert [(c["id"], c["exitcode"], c["run"]) for c in crashes] == [(ZEBRA, -signal.SIGKILL, "run1")]
    rows = load_done(layout, SHARD)
    assert sorted(rows) == IDS and rows[ZEBRA]["attempts"] == 2
    spoken = [r["id"] for path in layout.manifests(SHARD) for r in read_jsonl(path)]
    assert sorted(spoken) == IDS  # each id spoken once: the one in flight, and only it, again
    stats = read_json(layout.stats(SHARD))
    assert stats["done"] == 6 and stats["failed"] == 0 and stats["pending"] == 0
    assert len(deaths(caplog)) == 1 and f"on ['{ZEBRA}']" in deaths(caplog)[0]


def test_every_id_of_a_batch_in_flight_is_charged_and_then_spoken_alone(slot_run):
    assert slot_run("zebra=kill:1", 1, "ScriptedBatchTone") == EXIT_OK
    layout = slot_run.layout
    charged = [c["id"] for c in read_jsonl(layout.crashes(SHARD))]
    assert charged == HANDED[:3]  # the batch the worker had begun: which one killed it is not known
    rows = load_done(layout, SHARD)
    assert sorted(rows) == IDS and [rows[uid]["attempts"] for uid in HANDED] == [2, 2, 2, 1, 1, 1]
    texts = {row["id"]: row["text"] for row in rows.values()}
    calls = [c for c in read_jsonl(slot_run.tally / "calls.jsonl") if c["path"] != "build"]
    alone = [c["text"] for c in calls if c["path"] == "one"]
    assert alone == [texts[uid] for uid in HANDED[:3]]  # a charged id cannot take a batch down again


def test_an_utterance_that_kills_every_worker_fails_once_its_attempts_are_spent(slot_run, caplog):
    assert slot_run("zebra=kill:all", 1, "ScriptedTone", "workers.max_attempts=2") == EXIT_FAILURES
    layout = slot_run.layout
    assert [c["id"] for c in read_jsonl(layout.crashes(SHARD))] == [ZEBRA, ZEBRA]
    failure = load_failures(layout, SHARD)[ZEBRA]
    assert failure["errors"] == ["worker process died while speaking it (2x)"] and failure["attempts"] == 2
    assert sorted(load_done(layout, SHARD)) == [uid for uid in IDS if uid != ZEBRA]
    assert read_json(layout.stats(SHARD))["failed"] == 1
    # the second death came before its worker spoke anything, but one is not enough to give up
    assert len(deaths(caplog)) == 2 and not any("giving up" in r.getMessage() for r in caplog.records)


def test_deaths_with_speech_between_them_never_stop_the_slot(slot_run, caplog):
    # three texts kill a worker once each; every new worker speaks something before it meets the next
    assert slot_run("zebra=kill:1,weather=kill:1,riding=kill:1", workers=1) == EXIT_OK
    assert len(deaths(caplog)) == 3 >= MAX_BARREN_DEATHS
    assert sorted(load_done(slot_run.layout, SHARD)) == IDS


def test_workers_that_die_before_speaking_anything_stop_the_slot(slot_run, caplog):
    assert slot_run("@build=kill:all", workers=1) == EXIT_FAILURES
    assert len(deaths(caplog)) == MAX_BARREN_DEATHS
    assert any(
        f"died {MAX_BARREN_DEATHS} times in a row without speaking; giving up" in r.getMessage() for r in caplog.records
    )
    assert not slot_run.layout.stats(SHARD).exists()  # nothing was marked done
    builds = [c for c in read_jsonl(slot_run.tally / "calls.jsonl") if c["path"] == "build"]
    assert len(builds) == MAX_BARREN_DEATHS  # no worker was started after the last death


def test_a_worker_that_died_since_the_last_look_is_asked_for_nothing(tmp_path):
    """The slot may ask a busy worker for ids back in the instant after it died and before its
    sentinel is seen (CI met this once): the request must not raise, and the idle worker waits for
    the dead one's ids, which its death hands back."""
    ctx = multiprocessing.get_context("fork")
    conn, child_end = ctx.Pipe()
    dead = ctx.Process(target=time.sleep, args=(0,))
    dead.start()
    child_end.close()
    dead.join()
    slot = Slot(Layout(tmp_path / "out"), load_config(None, []), list, SlotOptions(0, 2, "run1"))
    busy = Handle(0, dead, conn, ready=True, pieces=[Piece(SHARD, IDS[:4], {})])
    idle = Handle(1, None, None, ready=True, wants=True)
    slot.handles = {0: busy, 1: idle}
    with pytest.raises(BrokenPipeError):
        conn.send("anything")  # the pipe really is broken
    assert slot.take_back_for(idle) is True  # the idle worker waits
    assert not busy.asked_back  # nothing is out: no Returned will come from the dead worker


@pytest.fixture
def fed_slot(tmp_path, monkeypatch):
    """run(answer, workers) plans the conversation and runs a slot fed by a driver thread: answer(words)
    is the driver's line for each request of the slot but "done", which gets none. The first "next"
    is answered "open" and "opened" with answer(words). Returns the slot's exit code."""
    monkeypatch.setenv("CONVTTS_TEST_SCRIPT", "")
    monkeypatch.setenv("CONVTTS_TEST_TALLY", str(tmp_path))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    layout = Layout(tmp_path / "out")
    config = load_config(None, ["tts.backend=scripted_backend:ScriptedTone"])
    make_plan(write_input(tmp_path / "in.json", [CONVERSATION]), layout, config, workers=1)
    asked = []  # every "next" line, in words

    def run(answer, workers: int) -> int:
        slot_reads, driver_writes = os.pipe()
        driver_reads, slot_writes = os.pipe()
        opened = []

        def driver() -> None:
            with os.fdopen(driver_reads) as requests, os.fdopen(driver_writes, "w", buffering=1) as answers:
                for line in requests:
                    words = line.split()
                    if words[0] == "next":
                        asked.append(words)
                    if words[0] == "next" and not opened:
                        opened.append(True)
                        answers.write(f"open {SHARD}\n")
                    elif words[0] != "done":
                        answers.write(answer(words) + "\n")

        thread = threading.Thread(target=driver, daemon=True)
        thread.start()
        feed = ShardFeed(slot_reads, slot_writes)
        slot = Slot(layout, config, list, SlotOptions(0, workers, "run1", str(tmp_path / "log")), feed=feed)
        code = slot.run()
        feed.requests.close()
        thread.join(timeout=10)
        assert sorted(r["id"] for path in layout.manifests(SHARD) for r in read_jsonl(path)) == IDS
        return code

    run.builds = lambda: sum(c["path"] == "build" for c in read_jsonl(tmp_path / "calls.jsonl"))
    run.asked = asked
    yield run
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_a_fed_slot_asks_again_as_soon_as_the_driver_says(fed_slot):
    """A driver answers "wait 0.1" while other slots finish: the idle slot asks again about then,
    not a second later, so that the run's end is seen at once; "" ends it, every id spoken once."""
    asks, waits = [], 3  # when the slot asked "next" after its piece; the first `waits` get "wait 0.1"

    def answer(words: list[str]) -> str:
        if words[0] == "opened":
            return f"piece 1 {SHARD} {' '.join(words[5:])}"
        asks.append(time.monotonic())
        return "wait 0.1" if len(asks) <= waits else ""

    assert fed_slot(answer, workers=1) == EXIT_OK
    assert {tuple(words) for words in fed_slot.asked} == {("next", "1", "1")}  # its rows, for the driver's window
    gaps = [b - a for a, b in zip(asks, asks[1:])]
    assert len(gaps) == waits and 0.09 < min(gaps) and max(gaps) < 0.6, gaps  # a second or two before


def test_a_fed_slot_stops_its_idle_workers_but_one_at_the_end_and_starts_them_again_for_more(fed_slot, caplog):
    """Once the driver says every id is out ("wait ... ending"), idle workers stop, as they do in a slot
    of its own shards, but one; work handed out after that (a lost slot's) starts them again."""
    caplog.set_level(logging.INFO, logger="convtts")
    held, asks = [], []

    def answer(words: list[str]) -> str:
        if words[0] == "opened":
            held.extend(words[8:])
            return f"piece 1 {SHARD} {' '.join(words[5:8])}"
        asks.append(words[0])
        if len(asks) <= 5:
            return "wait 0.1 ending"
        if len(asks) == 6:
            return f"recheck 2 {SHARD} {' '.join(held)}"
        return "wait 0.1" if fed_slot.builds() < 5 and len(asks) < 200 else ""  # until they are up (20 s at most)

    assert fed_slot(answer, workers=3) == EXIT_OK
    assert fed_slot.builds() == 5  # three, then the two stopped at the end, again
    restarted = [r.getMessage() for r in caplog.records if "started again" in r.getMessage()]
    assert len(restarted) == 2, restarted


@pytest.mark.parametrize(
    "answer, seconds", [("wait", 1.0), ("wait 0.25", 0.25), ("wait 0", 0.05), ("wait 600", 5.0), ("wait soon", 1.0)]
)
def test_a_wait_lasts_what_the_driver_says_within_bounds(answer, seconds):
    assert wait_seconds(answer.split()) == seconds
