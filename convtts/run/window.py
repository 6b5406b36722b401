"""The window of open shards that every dispatcher of pieces hands out from, longest first.

Two dispatchers cut pieces: a slot for its workers (convtts.run.pieces.WorkQueue) and the Ray
driver for its slots (convtts.cluster.handout.Book). Both keep shards open until their ids to hand
out fill WINDOW_BATCHES times the rows decoded at once (every shard, once the ids left fit
OPEN_ALL_BATCHES times), take each piece from the open shard whose next id is the longest, while its
ids are no shorter than the next shard's, size it by the work left over twice the takers, and close
a shard (its stats, then its done marker) once its last piece is in. A batched row takes as long as
its audio, so the rows begun last, which the end of a run waits for, are the shortest of the window.
That policy is here, once; what differs (a worker's crashes and hand-backs, a slot's first pieces
and a lost slot's rechecks) stays with each dispatcher.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from convtts.counts import plural
from convtts.state.layout import Layout
from convtts.state.shardio import write_marker

log = logging.getLogger(__name__)

MIN_PIECE = 2  # the tail: pieces this small, and idle workers take over ids not begun
PIECES_PER_TAKER = 2  # each cut takes 1/(this x workers, or slots) of the work left
WINDOW_BATCHES = 2  # shards open at once hold this many times the rows decoded at once
# Once the ids left fit this many times the rows decoded at once, every shard opens: the end of a run
# then goes out longest first over all of it. A long row takes two or three batches' time under a
# full GPU (40-48 s for 8-10 s of audio on an H200), and one opened late held the end of a run.
OPEN_ALL_BATCHES = 8
# Characters of English text a spoken word takes, space and punctuation included (about 6: the Q&A
# bench text holds 5.8 a word, the short-turn text 5.7). A row of long "words" (an OCR-token list:
# 30 words, 290 characters, spoken as 2-3 times the audio of 30 plain ones) is counted by them.
CHARS_PER_WORD = 6


def piece_size(remaining: int, takers: int, most: float) -> int:
    """Guided self-scheduling: the work left over PIECES_PER_TAKER times the takers (workers, or slots),
    at most `most` and at least MIN_PIECE."""
    return max(MIN_PIECE, min(most, math.ceil(remaining / (PIECES_PER_TAKER * max(takers, 1)))))


def wants_shard(pending: int, remaining: int, rows: int) -> bool:
    """Whether to open another shard: the open ones hold `pending` ids to hand out, `remaining` are
    left in all (estimated for shards not opened), and `rows` are decoded at once by all takers."""
    return pending < WINDOW_BATCHES * rows or remaining <= OPEN_ALL_BATCHES * rows


@dataclass
class OpenShard:
    """An opened shard: its ids still to hand out (longest first) and what its pieces have brought back."""

    name: str
    segments: int
    pending: deque
    already: int = 0  # spoken before this run opened it
    audio_seconds: float = 0.0
    words: dict = field(default_factory=dict)  # words of each id to speak: the plan's estimate of its length
    front: int = 0  # ids at the head of `pending` that were handed back: they go out before any other
    pieces: int = 0
    new: int = 0
    failed: int = 0
    started: float = field(default_factory=time.time)

    def stats(self, run_id: str) -> dict:
        return {
            "shard": self.name,
            "segments": self.segments,
            "done": self.already + self.new,
            "failed": self.failed,
            "pending": len(self.pending),
            "new": self.new,
            "pieces": self.pieces,
            "audio_seconds": round(self.audio_seconds, 3),
            "seconds": round(time.time() - self.started, 3),
            "run": run_id,
        }


class Window:
    """A dispatcher's open shards. `words`: the length counted for an id a shard has no words for."""

    def __init__(self, layout: Layout, run_id: str, words: float = 0.0):
        self.layout, self.run_id, self.words = layout, run_id, words
        self.open: dict[str, OpenShard] = {}

    def pending(self) -> int:
        return sum(len(work.pending) for work in self.open.values())

    def wants_shard(self, remaining: int, rows: int) -> bool:
        return wants_shard(self.pending(), remaining, rows)

    def words_of(self, work: OpenShard, uid: str) -> float:
        return work.words.get(uid, self.words)

    def first_in_line(self) -> OpenShard | None:
        """The open shard with ids handed back, else the one whose next id is the longest (the oldest on a tie)."""
        live = [work for work in self.open.values() if work.pending]
        if not live:
            return None
        return max(live, key=lambda work: (work.front > 0, self.words_of(work, work.pending[0])))

    def take(self, work: OpenShard, size: int) -> list[str]:
        """Up to `size` ids from the head of `work`: its handed-back ones, then those no shorter than
        the next id of any other open shard (so the window goes out longest first); no runt left."""
        ids = take_longest(self.open.values(), work, size, self.words_of, work.front)
        work.front = max(0, work.front - len(ids))
        return ids

    def put_back(self, shard: str, ids: list[str]) -> None:
        """Ids handed back unspoken: first in line again, in the order they went out."""
        work = self.open[shard]
        work.pending.extendleft(reversed(ids))
        work.front += len(ids)

    def close(self, work: OpenShard, manifests: list[Path] | None = None) -> None:
        """The shard's stats, then its done marker (last); it leaves the window."""
        stats = work.stats(self.run_id)
        write_marker(self.layout, work.name, stats, manifests)
        del self.open[work.name]
        log.info(
            "%s finished: %d of %d spoken (%d now, in %s), %d failed",
            work.name,
            stats["done"],
            work.segments,
            work.new,
            plural(work.pieces, "piece"),
            work.failed,
        )


def take_longest(works, work, size: int, words_of, front: int = 0) -> list[str]:
    """Up to `size` ids from the head of `work.pending`: the first `front` (handed back) and at least
    MIN_PIECE whatever their length, then while they are no shorter than the next id of any other of
    the open `works` (words_of(shard, id)); a runt of fewer than MIN_PIECE left behind is taken too."""
    bar = max((words_of(w, w.pending[0]) for w in works if w.pending and w is not work), default=0)
    pending, ids = work.pending, []
    while pending and len(ids) < size:
        if len(ids) >= max(MIN_PIECE, front) and words_of(work, pending[0]) < bar:
            break
        ids.append(pending.popleft())
    if len(pending) < MIN_PIECE:
        ids += [pending.popleft() for _ in range(len(pending))]
    return ids


def longest_next(works):
    """Of shards with ids to hand out (each with `pending` and `words`), the one whose next id is the
    longest (the first on a tie); None when none has any."""
    live = [w for w in works if w.pending]
    return max(live, key=lambda w: w.words.get(w.pending[0], 0), default=None)


def row_words(rows: list[dict]) -> dict[str, int]:
    """Each row's words (the plan's count, else its text's), or its characters over CHARS_PER_WORD where
    that is more: how long its utterance will be, roughly."""
    return {row["id"]: spoken_words(row) for row in rows}


def spoken_words(row: dict) -> int:
    text = row.get("text", "")
    return max(row.get("words") or len(text.split()), len(text) // CHARS_PER_WORD)


def longest_first(rows: list[dict], words: dict[str, int]) -> list[str]:
    """A shard's ids to speak, the longest first (ties in plan order): the last ones a worker begins
    set how long the others wait at the end of a run, and a batched row takes as long as its audio."""
    return [row["id"] for row in sorted(rows, key=lambda row: -words[row["id"]])]
