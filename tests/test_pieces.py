"""A slot's pieces of work: their sizes, the tail, the hand-back after a worker dies, and each shard's
stats file written last, on a real output folder (plan files, manifests, audio) and no processes."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest
import soundfile as sf

from conftest import read_jsonl
from convtts.run.pieces import (
    MAX_PIECE,
    MIN_PIECE,
    WorkQueue,
    batched_room,
    cut_size,
    preview_cuts,
    preview_room,
)
from convtts.state.layout import Layout, shard_name
from convtts.state.shardio import append_line, read_json, shard_complete

RUN = "run1"


# -- sizes ------------------------------------------------------------------------------------------


def test_one_shard_on_four_workers_is_cut_as_the_module_says():
    assert preview_cuts([100], 4) == [13, 11, 10, 9, 8, 7, 6, 5, 4, 4, 3, 3, 3] + [MIN_PIECE] * 7


def test_a_big_run_starts_with_the_largest_pieces_and_ends_with_the_tail():
    sizes = preview_cuts([1000] * 3, 8)
    assert sum(sizes) == 3000 and sizes[:5] == [MAX_PIECE] * 5
    assert sizes[-8:] == [MIN_PIECE] * 8  # every one of eight workers ends on a piece of two


@pytest.mark.parametrize(
    "counts, workers, rows",
    [
        ([100], 4, 1),
        ([7, 1, 30, 2], 3, 1),
        ([5, 1, 30], 2, 4),
        ([500, 3, 64], 16, 8),
        ([3], 1, 1),
        ([1000], 1, 32),
    ],
)
def test_every_piece_is_within_bounds_and_no_shard_leaves_a_runt(counts, workers, rows):
    low, high = MIN_PIECE, max(MAX_PIECE, 4 * rows)
    sizes, remaining = [], sum(counts)
    for count in counts:
        cut, available = [], count
        while available:
            room = preview_room(rows, len(sizes) + len(cut), workers)
            cut.append(cut_size(available, remaining, workers, rows, room))
            available -= cut[-1]
            remaining -= cut[-1]
        assert sum(cut) == count and all(size <= high + low - 1 for size in cut)
        # a piece smaller than the floor is a whole shard smaller than it, never a shard's leftover
        assert all(size >= low for size in cut) or (cut == [count] and count < low)
        sizes += cut
    assert sizes == preview_cuts(counts, workers, rows) and sum(sizes) == sum(counts)


def test_a_batched_worker_asks_for_its_rows_first_and_then_an_eighth_of_them():
    assert batched_room(64, 0) == 80  # its rows and the engine's look-ahead of a quarter
    assert batched_room(64, 70) == 10
    assert batched_room(64, 112) == 8  # busy: an eighth of its rows a piece
    assert batched_room(1, 0) == 0  # one row: as many as the slot cuts
    sizes = preview_cuts([1000], 4, rows=64)
    assert sizes[:4] == [80] * 4 and set(sizes[4:80]) == {8} and max(sizes[4:]) == 8, sizes
    assert sizes[-1] == MIN_PIECE and sum(sizes) == 1000  # and the tail's pieces shrink as before


def test_a_holding_worker_asks_for_its_rows_then_to_fill_them_again_then_an_eighth_of_them():
    # workers.hold_first_batch: its first rows decode to their end with nothing added, then it holds none
    sizes = preview_cuts([1000], 4, rows=64, hold=True)
    assert sizes[:4] == [64] * 4 and sizes[4:6] == [80] * 2 and max(sizes[4:8]) == 80, sizes  # then a share of the rest
    assert set(sizes[8:50]) == {8} and max(sizes[8:]) == 8 and sum(sizes) == 1000, sizes
    assert preview_cuts([100], 4, hold=True) == preview_cuts([100], 4)  # one row a worker: no batch to hold


def test_a_batched_worker_gets_up_to_four_batches_early_and_the_tail_pieces_late():
    # it asks for its next piece before its rows run dry, so a piece need not fill them
    sizes = preview_cuts([200], 4, rows=8)
    assert max(sizes) <= max(MAX_PIECE, 32) and sum(sizes) == 200
    assert min(sizes) == MIN_PIECE and sizes[-1] <= MIN_PIECE + 1  # the last hold 2, or 3 rather than leave 1
    assert cut_size(10_000, 10_000, 4, rows=32) == 128  # four batches of 32 rows at most...
    assert cut_size(200, 200, 4, rows=32) == 25  # ...and as the work left says below that


# -- a real output folder ---------------------------------------------------------------------------


def plan(root, *sizes: int) -> Layout:
    """A plan of shards holding `sizes` segments each: ids s{shard}-{index:03d}, in plan order."""
    layout = Layout(root / "out")
    layout.shards_dir.mkdir(parents=True)
    layout.work_dir.mkdir()
    for number, size in enumerate(sizes):
        rows = [{"id": f"s{number}-{i:03d}", "text": f"segment {i}", "speaker": "joe"} for i in range(size)]
        layout.shard_file(shard_name(number)).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return layout


def test_a_shards_ids_go_out_longest_first_ties_in_plan_order(tmp_path):
    """The last pieces of a shard hold its shortest utterances: the end of a run waits on short rows."""
    layout = plan(tmp_path, 0)
    lengths = [3, 12, 3, 30, 7, 12, 1, 3]
    rows = [{"id": f"u{n}", "text": " ".join(["word"] * k), "speaker": "joe"} for n, k in enumerate(lengths)]
    layout.shard_file("shard-00000").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    spoken_before(layout, "shard-00000", "u3")  # the longest was spoken by an earlier run
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=1)
    handed = []
    while (piece := queue.next_piece()) is not None:
        handed += piece.ids
    assert handed == ["u1", "u5", "u4", "u0", "u2", "u7", "u6"]


def test_a_row_of_long_tokens_goes_out_before_plain_rows_of_as_many_words(tmp_path):
    """An OCR-token list of 30 words is spoken as two or three times the audio of 30 plain words: counted
    by its characters, it goes out with the longest, not among rows of 30 words."""
    layout = plan(tmp_path, 0)
    plain = " ".join(["word"] * 30)
    ocr = ", ".join(["CALORIECOLA", "oZ(222mL)", "REALConK.TASTE", "ZEROCALORIO", "LORIECOL"] * 6)
    rows = [
        {"id": "plain30", "text": plain, "speaker": "joe", "words": 30},
        {"id": "plain45", "text": " ".join(["word"] * 45), "speaker": "joe", "words": 45},
        {"id": "ocr30", "text": ocr, "speaker": "joe", "words": 30},
    ]
    layout.shard_file("shard-00000").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=1)
    handed = []
    while (piece := queue.next_piece()) is not None:
        handed += piece.ids
    assert handed == ["ocr30", "plain45", "plain30"]


def spoken_before(layout: Layout, shard: str, uid: str, writer: str = "w0") -> None:
    """A row and its audio, as an earlier run's worker left them."""
    audio = layout.audio_dir(shard) / f"{uid}.wav"
    audio.parent.mkdir(parents=True, exist_ok=True)
    sf.write(audio, np.full(1600, 0.1, dtype=np.float32), 16000)
    append_line(
        layout.manifest(shard, writer),
        {"id": uid, "audio": str(audio.relative_to(layout.root)), "num_samples": 1600, "duration": 0.1, "run": "run0"},
    )


def speak_all(queue: WorkQueue, piece, ok: bool = True) -> None:
    for uid in piece.ids:
        piece.started.add(uid)
        queue.reported(piece, uid, ok, audio_seconds=1.0)


def test_pieces_follow_the_preview_and_the_stats_file_comes_last(tmp_path):
    layout = plan(tmp_path, 30)
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=2)
    pieces = []
    while (piece := queue.next_piece()) is not None:
        pieces.append(piece)
    assert [len(p.ids) for p in pieces] == preview_cuts([30], 2)
    assert [uid for p in pieces for uid in p.ids] == [f"s0-{i:03d}" for i in range(30)]  # plan order, each once
    for piece in reversed(pieces):  # reported out of order: the stats wait for the last piece out
        assert not layout.stats("shard-00000").exists()
        speak_all(queue, piece)  # a piece is in once each of its ids is reported
    stats = read_json(layout.stats("shard-00000"))
    assert stats["done"] == stats["new"] == stats["segments"] == 30 and stats["pieces"] == len(pieces)
    assert stats["failed"] == stats["pending"] == 0 and stats["audio_seconds"] == 30 and stats["run"] == RUN
    assert shard_complete(layout, "shard-00000") and not queue.has_work()


def test_a_failed_utterance_leaves_its_shard_incomplete(tmp_path):
    layout = plan(tmp_path, 4)
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=1)
    while (piece := queue.next_piece()) is not None:
        speak_all(queue, piece, ok=False)
    assert read_json(layout.stats("shard-00000"))["failed"] == 4 and not shard_complete(layout, "shard-00000")


def test_opening_a_shard_resumes_it(tmp_path):
    layout = plan(tmp_path, 6)
    for uid in ("s0-000", "s0-003"):
        spoken_before(layout, "shard-00000", uid)
    layout.stats("shard-00000").write_bytes(b'{"failed": 0, "pending": 0}')  # a stale done marker
    leftover = layout.audio_dir("shard-00000") / ".s0-001.wav.tmp999"  # a worker killed mid-write
    leftover.write_bytes(b"half")
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=1)
    assert queue.total == 4  # estimated from line counts before the shard is opened
    pieces = []
    while (piece := queue.next_piece()) is not None:
        assert not layout.stats("shard-00000").exists() and not leftover.exists()
        pieces.append(piece)
    assert [uid for p in pieces for uid in p.ids] == ["s0-001", "s0-002", "s0-004", "s0-005"]
    for piece in pieces:
        speak_all(queue, piece)
    stats = read_json(layout.stats("shard-00000"))
    assert stats["done"] == 6 and stats["new"] == 4 and stats["audio_seconds"] == pytest.approx(4.2)


def test_a_shard_with_nothing_left_to_speak_gets_its_stats_at_once(tmp_path):
    layout = plan(tmp_path, 2, 3)
    for uid in ("s0-000", "s0-001"):
        spoken_before(layout, "shard-00000", uid)
    queue = WorkQueue(layout, ["shard-00000", "shard-00001"], RUN, workers=1)
    piece = queue.next_piece()
    assert piece.shard == "shard-00001"
    assert read_json(layout.stats("shard-00000"))["done"] == 2  # closed on the way to the next shard


def test_a_dead_workers_unreported_ids_go_back_first_in_line_and_only_the_one_in_flight_is_charged(tmp_path):
    layout = plan(tmp_path, 12)
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=1)
    first = queue.next_piece()
    assert len(first.ids) == 6
    for uid in first.ids[:2]:
        first.started.add(uid)
        queue.reported(first, uid, True, 1.0)
    first.started.add(first.ids[2])  # it died speaking this one
    audio = layout.audio_dir("shard-00000")
    mine, other = audio / f".{first.ids[2]}.wav.tmp4242", audio / f".{first.ids[5]}.wav.tmp42421"
    mine.write_bytes(b"half")
    other.write_bytes(b"a live worker's")  # pid 42421 is not pid 4242

    assert queue.worker_died(first, -9, 4242) == [first.ids[2]]
    assert not mine.exists() and other.exists()
    crash = read_jsonl(layout.crashes("shard-00000"))
    assert [(c["id"], c["exitcode"], c["run"]) for c in crash] == [(first.ids[2], -9, RUN)]
    again = queue.next_piece()
    assert again.ids[:4] == first.ids[2:] and again.crashes == {first.ids[2]: 1}
    assert not layout.stats("shard-00000").exists()


def test_every_id_of_a_batch_in_flight_is_charged(tmp_path):
    layout = plan(tmp_path, 6)
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=1)
    queue.rows = 3
    piece = queue.next_piece()
    piece.started.update(piece.ids[:3])  # one batch of three begun, none finished
    assert queue.worker_died(piece, -11, 1) == piece.ids[:3]
    assert queue.next_piece().crashes == dict.fromkeys(piece.ids[:3], 1)


def test_errors_handed_back_with_ids_go_out_with_them_until_the_id_is_reported(tmp_path):
    """A worker hands back ids it tried (their batch ran out of memory) with each attempt's error: the
    pieces they go out in carry them, a worker's death loses none, and a report of the id drops them."""
    layout = plan(tmp_path, 6)
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=1)
    queue.rows = 3
    piece = queue.next_piece()
    tried = {piece.ids[1]: ("OutOfMemory: CUDA out of memory.",)}
    queue.returned(piece, piece.ids[:2], tried)
    again = queue.next_piece()
    assert again.ids[:2] == piece.ids[:2] and again.errors == tried
    queue.worker_died(again, -9, 4242)  # nothing begun: all back, the errors still theirs
    third = queue.next_piece()
    assert third.errors == tried
    queue.reported(third, piece.ids[1], True, 1.0)
    queue.worker_died(third, -9, 4242)
    assert queue.next_piece().errors == {}  # spoken: nothing of it is carried any more


def test_deaths_in_this_run_are_remembered_when_the_slot_starts_again(tmp_path):
    layout = plan(tmp_path, 4)
    append_line(layout.crashes("shard-00000"), {"id": "s0-001", "run": RUN, "exitcode": -9, "time": 1.0})
    append_line(layout.crashes("shard-00000"), {"id": "s0-001", "run": RUN, "exitcode": -9, "time": 2.0})
    append_line(layout.crashes("shard-00000"), {"id": "s0-002", "run": "run0", "exitcode": -9, "time": 0.5})
    piece = WorkQueue(layout, ["shard-00000"], RUN, workers=1).next_piece()
    assert piece.crashes == {"s0-001": 2}  # an earlier run's deaths do not count against this one


def test_remaining_work_sizes_pieces_across_shards(tmp_path):
    layout = plan(tmp_path, 40, 40)
    queue = WorkQueue(layout, ["shard-00000", "shard-00001"], RUN, workers=2)
    first = queue.next_piece()
    assert len(first.ids) == math.ceil(80 / 4) and queue.remaining() == 60


def plan_words(root, *shards: list[int]) -> Layout:
    """A plan whose shards hold segments of these word counts: ids s{shard}-{index}, in plan order."""
    layout = plan(root, *[0] * len(shards))
    for number, words in enumerate(shards):
        rows = [{"id": f"s{number}-{i}", "text": " ".join(["word"] * k), "speaker": "joe"} for i, k in enumerate(words)]
        layout.shard_file(shard_name(number)).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return layout


def test_the_open_window_goes_out_longest_first_across_shards(tmp_path):
    """The rows a run begins last hold the shortest utterances of every open shard, not the long ones of
    the last shard opened: each piece stops where another open shard's next id is longer."""
    shards = [[12, 11, 6, 5, 2, 1, 1, 1], [10, 9, 8, 7, 4, 3, 1, 1]]
    layout = plan_words(tmp_path, *shards)
    words = {f"s{n}-{i}": k for n, ws in enumerate(shards) for i, k in enumerate(ws)}
    queue = WorkQueue(layout, ["shard-00000", "shard-00001"], RUN, workers=1)
    queue.rows = 20  # a window of 40 ids: both shards open at once
    pieces = []
    while (piece := queue.next_piece()) is not None:
        pieces.append(piece)
    handed = [uid for p in pieces for uid in p.ids]
    assert [words[uid] for uid in handed] == [12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 1, 1, 1, 1]
    assert sorted(handed) == sorted(words)  # each id once
    assert all(len({uid.split("-")[0] for uid in p.ids}) == 1 for p in pieces)  # a piece is one shard's
    assert [p.shard for p in pieces[:4]] == ["shard-00000", "shard-00001", "shard-00000", "shard-00001"]


def test_a_shard_opens_only_when_the_window_needs_it_and_all_open_near_the_end(tmp_path):
    layout = plan(tmp_path, *[30] * 6)
    queue = WorkQueue(layout, [shard_name(n) for n in range(6)], RUN, workers=2)
    queue.rows = 8  # a window of 32 ids: two shards of 30; all open once 128 ids are left
    queue.next_piece()
    assert list(queue.window.open) == ["shard-00000", "shard-00001"] and len(queue.waiting) == 4
    assert not layout.audio_dir("shard-00002").exists()  # not opened: no resume bookkeeping yet
    while queue.remaining() > 128:
        assert queue.waiting
        # the running sum of the waiting shards' estimates (remaining() is asked several times a piece)
        assert queue.remaining() == sum(len(w.pending) for w in queue.window.open.values()) + 30 * len(queue.waiting)
        queue.next_piece()
    queue.next_piece()
    assert not queue.waiting and len(queue.window.open) == 6
    assert queue.remaining() == sum(len(w.pending) for w in queue.window.open.values())


def test_a_short_run_opens_every_shard_and_goes_out_longest_first_over_all_of_it(tmp_path):
    """A run whose ids fit OPEN_ALL_BATCHES times the workers' rows opens all its shards at its first
    piece: the long rows of the last shard begin with the first batch, not near the end."""
    shards = [[3, 3, 2, 2], [4, 3, 2, 1], [9, 8, 1, 1]]
    layout = plan_words(tmp_path, *shards)
    queue = WorkQueue(layout, [shard_name(n) for n in range(3)], RUN, workers=1)
    queue.rows = 2  # a window of 4 ids, 16 ids to open them all: 12 are left
    first = queue.next_piece()
    assert len(queue.window.open) == 3 and first.ids[:2] == ["s2-0", "s2-1"]


def test_ids_handed_back_go_out_before_a_longer_shard(tmp_path, monkeypatch):
    monkeypatch.setattr("convtts.run.window.OPEN_ALL_BATCHES", 0)  # the window alone
    layout = plan_words(tmp_path, [3, 3, 3, 3], [9, 9, 9, 9])
    queue = WorkQueue(layout, ["shard-00000", "shard-00001"], RUN, workers=1)
    queue.rows = 2  # a window of 4 ids: the second shard opens once the first is out
    first = queue.next_piece()
    assert first.ids == ["s0-0", "s0-1", "s0-2", "s0-3"]
    assert queue.next_piece().ids[:2] == ["s1-0", "s1-1"]
    queue.worker_died(first, -9, 4242)  # nothing of it begun: all four back
    again = queue.next_piece()
    assert again.shard == "shard-00000" and again.ids == first.ids


def test_the_ray_driver_hands_out_its_window_longest_first_across_shards(tmp_path, monkeypatch):
    """The driver's book (convtts.cluster.handout) keeps shards open until its window is full and
    cuts each piece from the shard whose next id is the longest, as a slot does with its own shards;
    a shard past the window opens once the open ones run low. The window is the rows the slot says
    it decodes."""
    from convtts.cluster import handout
    from convtts.run.pieces import open_shard

    monkeypatch.setattr("convtts.run.window.OPEN_ALL_BATCHES", 0)  # the window alone
    shards = [[12, 11, 6, 5, 2, 1, 1, 1], [10, 9, 8, 7, 4, 3, 1, 1], [13, 1]]
    layout = plan_words(tmp_path, *shards)
    words = {f"s{n}-{i}": k for n, ws in enumerate(shards) for i, k in enumerate(ws)}
    book = handout.Book(layout, [shard_name(n) for n in range(3)], RUN)
    book.sized(0, 5, 5)  # "next 5 5": one worker of 5 rows: a window of 10 ids, the third shard waits
    answers, out = [], []
    while answer := book.hand_out(0, [0]):
        out.append(book.all_out())  # the slots are told "ending" once every id is out, not before
        kind, *rest = answer.split()  # "open SHARD" or "piece NUMBER SHARD IDS..."
        if kind == "open":  # what a slot does and says back
            work = open_shard(layout, rest[0], RUN)
            book.opened(rest[0], work.segments, work.already, work.audio_seconds, list(work.pending))
            answers.append((kind, rest[0], []))
        else:
            answers.append((kind, rest[1], rest[2:]))
    opened = [name for kind, name, _ in answers if kind == "open"]
    pieces = [(name, ids) for kind, name, ids in answers if kind == "piece"]
    assert opened == ["shard-00000", "shard-00001", "shard-00002"]
    assert [kind for kind, _, _ in answers[:3]] == ["open", "open", "piece"]  # 8 ids short of the window, 16 fill it
    handed = [uid for _, ids in pieces for uid in ids]
    assert sorted(handed) == sorted(words)  # each id once
    assert out == [False] * (len(answers) - 1) + [True] and book.busy()  # what a slot holds may yet come back
    assert all(len({uid.split("-")[0] for uid in ids}) == 1 for _, ids in pieces)  # a piece is one shard's
    before_third = handed[: handed.index("s2-0")]
    assert [words[uid] for uid in before_third] == sorted((words[u] for u in before_third), reverse=True)
    assert [words[uid] for uid in handed[:6]] == [12, 11, 10, 9, 8, 7]
    assert [name for name, _ in pieces[:3]] == ["shard-00000", "shard-00001", "shard-00000"]


def test_a_slot_and_the_ray_driver_hand_out_one_window_in_the_same_order(tmp_path, monkeypatch):
    """One policy (convtts.run.window): a slot of one worker of 5 rows and the driver with one slot that
    says 5 rows open the same shards at the same points and hand out the same ids in the same order."""
    from convtts.cluster import handout
    from convtts.run.pieces import open_shard

    monkeypatch.setattr("convtts.run.window.OPEN_ALL_BATCHES", 0)  # the window alone: shards open one by one
    shards = [[12, 11, 6, 5, 2, 1, 1, 1], [10, 9, 8, 7, 4, 3, 1, 1], [13, 1, 1, 1]]
    names = [shard_name(n) for n in range(3)]
    queue = WorkQueue(plan_words(tmp_path / "slot", *shards), names, RUN, workers=1)
    queue.rows = 5
    by_slot, opened_by_slot = [], []
    while (piece := queue.next_piece()) is not None:
        opened_by_slot += [name for name in queue.window.open if name not in opened_by_slot]
        by_slot += piece.ids
    layout = plan_words(tmp_path / "ray", *shards)
    book = handout.Book(layout, names, RUN)
    book.sized(0, 5, 5)
    by_driver, opened_by_driver = [], []
    while answer := book.hand_out(0, [0]):
        kind, *rest = answer.split()
        if kind == "open":
            work = open_shard(layout, rest[0], RUN)
            book.opened(rest[0], work.segments, work.already, work.audio_seconds, list(work.pending))
            opened_by_driver.append((rest[0], len(by_driver)))
        else:
            by_driver += rest[2:]
    assert by_driver == by_slot and len(by_slot) == 20
    assert [name for name, _ in opened_by_driver] == names == opened_by_slot
    assert opened_by_driver[2][1] > 0  # the third shard opened once the window ran low, not at the start


def test_the_ray_driver_opens_every_shard_of_a_short_run_first(tmp_path):
    from convtts.cluster import handout
    from convtts.run.pieces import open_shard

    layout = plan_words(tmp_path, [3, 3, 2, 2, 1, 1, 1, 1], [4, 3, 2, 1, 1, 1, 1, 1], [13, 1])
    book = handout.Book(layout, [shard_name(n) for n in range(3)], RUN)
    book.sized(0, 5, 5)  # a window of 10 ids; all open while 40 or fewer are left
    answers = []
    while (answer := book.hand_out(0, [0])).startswith("open"):
        name = answer.split()[1]
        work = open_shard(layout, name, RUN)
        book.opened(name, work.segments, work.already, work.audio_seconds, list(work.pending))
        answers.append(name)
    assert answers == [shard_name(n) for n in range(3)]
    assert answer.split()[2:4] == ["shard-00002", "s2-0"]  # the longest id of the run goes out first


def _opened_book(tmp_path, shards: list[list[int]], ranks: list[int], sizes: tuple[int, int]):
    """A driver's book of these shards with every shard opened (as a slot would), and each id's words;
    `sizes`: the rows and a worker's rows the first rank said."""
    from convtts.cluster import handout
    from convtts.run.pieces import open_shard

    layout = plan_words(tmp_path, *shards)
    book = handout.Book(layout, [shard_name(n) for n in range(len(shards))], RUN)
    book.sized(ranks[0], *sizes)
    while book.unopened:
        kind, name = book.hand_out(ranks[0], ranks).split()
        assert kind == "open"
        work = open_shard(layout, name, RUN)
        book.opened(name, work.segments, work.already, work.audio_seconds, list(work.pending))
    words = {f"s{n}-{i}": k for n, ws in enumerate(shards) for i, k in enumerate(ws)}
    return book, words


def _piece_ids(answer: str) -> list[str]:
    kind, _number, _shard, *ids = answer.split()
    assert kind == "piece"
    return ids


def test_the_ray_driver_gives_a_slot_that_asks_late_its_share_of_the_longest_ids(tmp_path):
    """Slots come up apart: the first to ask must not take every long id before the other asks. Until a
    slot has had a piece, each piece cut for another is matched by the next-longest set aside for it;
    it gets those first, so both begin with the same mix of lengths."""

    shards = [list(range(60, 0, -2)), list(range(59, 0, -2))]  # 60 ids of 60..1 words, one of each
    # slot 0 says 16 rows, 2 a worker; slot 1, not heard from, counts as slot 0: 20 ids set aside for it
    book, words = _opened_book(tmp_path, shards, [0, 1], sizes=(16, 2))
    first = [uid for _ in range(10) for uid in _piece_ids(book.hand_out(0, [0, 1]))]  # slot 1 still loading
    late = [uid for _ in range(10) for uid in _piece_ids(book.hand_out(1, [0, 1]))]
    assert len(first) == len(late) == 20
    assert [words[u] for u in first[:4]] == [60, 58, 56, 54]  # pieces of MIN_PIECE: a shard's next is longer
    assert [words[u] for u in late[:4]] == [59, 57, 55, 53]
    assert abs(sum(words[u] for u in first) - sum(words[u] for u in late)) <= 2 * len(first)
    assert set(first).isdisjoint(late)
    # without setting aside, the first slot would have had all of 60..41 and the late one 40..21
    assert min(words[u] for u in late[:10]) > 40
    rest = []
    while answer := book.hand_out(0, [0, 1]):
        rest += _piece_ids(answer)
    assert sorted(first + late + rest) == sorted(words)  # every id once
    assert not book.kept_ids() and book.all_out()


def test_the_ray_driver_cuts_and_keeps_first_pieces_by_the_rows_a_slot_says(tmp_path):
    """Slot 0 says 40 rows, 5 a worker ("next 40 5"): while slot 1 has had nothing, each piece is
    one worker's rows, and what is set aside for slot 1 (counted as slot 0) stops at its rows and a
    quarter more."""
    book, _ = _opened_book(tmp_path, [list(range(400, 0, -1))], [0, 1], sizes=(40, 5))
    assert len(_piece_ids(book.hand_out(0, [0, 1]))) == 5
    for _ in range(20):
        book.hand_out(0, [0, 1])
    assert book.kept_for(1) == 50


def test_pieces_set_aside_for_a_slot_go_to_others_when_it_is_lost_or_late(tmp_path, monkeypatch):
    from convtts.cluster import handout

    monkeypatch.setattr(handout, "KEEP_FOR", 0.2)
    shards = [list(range(40, 0, -1))]
    book, words = _opened_book(tmp_path, shards, [0, 1, 2], sizes=(16, 2))
    a = _piece_ids(book.hand_out(0, [0, 1, 2]))  # 40, 39 for slot 0; 38, 37 kept for 1; 36, 35 for 2
    assert [words[u] for u in a] == [40, 39] and book.kept_for(1) == book.kept_for(2) == 2
    book.give_back(1, None)  # slot 1 lost before it asked: its share is anyone's, before any new cut
    b = _piece_ids(book.hand_out(0, [0, 2]))
    assert [words[u] for u in b] == [38, 37]
    c = _piece_ids(book.hand_out(0, [0, 2]))  # slot 2's is kept for it while it is fresh
    assert [words[u] for u in c] == [34, 33] and book.kept_for(2) == 4
    import time

    time.sleep(0.25)  # slot 2 has not asked for KEEP_FOR seconds: its pieces go to whoever asks
    d = _piece_ids(book.hand_out(0, [0, 2]))
    assert [words[u] for u in d] == [36, 35]
    e = _piece_ids(book.hand_out(2, [0, 2]))  # it asks at last: what is left set aside for it
    assert [words[u] for u in e] == [32, 31]
    out = a + b + c + d + e
    while answer := book.hand_out(2, [0, 2]):
        out += _piece_ids(answer)
    assert sorted(out) == sorted(words) and not book.kept_ids()


def test_a_shard_is_not_finished_while_a_piece_of_it_is_set_aside(tmp_path):
    book, words = _opened_book(tmp_path, [[4, 3, 2, 1]], [0, 1], sizes=(16, 2))
    answer = book.hand_out(0, [0, 1])  # [4, 3] for slot 0, [2, 1] kept for slot 1
    book.done(int(answer.split()[1]), 2, 0, 1.0)
    assert book.window.open and not book.finished and not book.all_out()
    kept = book.hand_out(1, [0, 1])
    assert [words[u] for u in _piece_ids(kept)] == [2, 1]
    book.done(int(kept.split()[1]), 2, 0, 1.0)
    assert book.finished == {"shard-00000"} and not book.window.open


def test_first_batches_are_dealt_from_the_longest_ids_when_asked(tmp_path):
    """workers.deal_first_batch: each of the four workers' first batches takes every fourth of the longest
    ids, so none holds all of them; the pieces after go out longest first as before, each id once."""
    lengths = list(range(64, 0, -1))
    layout = plan_words(tmp_path, lengths)
    words = {f"s0-{i}": k for i, k in enumerate(lengths)}
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=4)
    queue.rows, queue.deal = 4, True
    firsts = [queue.next_piece(room=4) for _ in range(4)]
    assert [[words[uid] for uid in p.ids] for p in firsts] == [
        [64, 60, 56, 52],
        [63, 59, 55, 51],
        [62, 58, 54, 50],
        [61, 57, 53, 49],
    ]
    rest = []
    while (piece := queue.next_piece(room=4)) is not None:
        rest += piece.ids
    assert [words[uid] for uid in rest] == list(range(48, 0, -1))
    handed = [uid for p in firsts for uid in p.ids] + rest
    assert len(handed) == len(set(handed)) == 64


def test_without_dealing_the_first_worker_takes_the_longest_ids(tmp_path):
    lengths = list(range(64, 0, -1))
    layout = plan_words(tmp_path, lengths)
    words = {f"s0-{i}": k for i, k in enumerate(lengths)}
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=4)
    queue.rows = 4
    assert [words[uid] for uid in queue.next_piece(room=4).ids] == [64, 63, 62, 61]


def test_a_shard_smaller_than_the_dealt_batches_deals_at_a_smaller_stride(tmp_path):
    lengths = list(range(10, 0, -1))
    layout = plan_words(tmp_path, lengths)
    words = {f"s0-{i}": k for i, k in enumerate(lengths)}
    queue = WorkQueue(layout, ["shard-00000"], RUN, workers=4)
    queue.rows, queue.deal = 4, True
    handed = []
    while (piece := queue.next_piece(room=4)) is not None:
        handed.append([words[uid] for uid in piece.ids])
    assert sorted(k for p in handed for k in p) == lengths[::-1]  # each id once
    assert handed[0][0] == 10 and 9 not in handed[0]  # the two longest go to two workers
