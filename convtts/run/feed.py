"""Shards handed to a slot one at a time by a driver (the Ray engine), instead of a fixed share.

The slot writes requests on one pipe and reads answers on another, a line each:

    slot -> driver: "next"            it has no ids left to hand out and wants a shard
                    "done shard-00042" it wrote that shard's stats (the shard is finished)
    driver -> slot: "shard-00042"      the next shard is this one
                    "wait"             none now, but a shard held elsewhere may come back: ask again later
                    ""                 nothing is left: stop when the work in hand is done

A closed pipe reads as "": a driver that is gone hands out nothing more.
"""
from __future__ import annotations

import os
import time

WAIT = "wait"
ASK_EVERY = 1.0  # seconds between asks after a "wait": the slot's loop polls, the driver is not flooded


class ShardFeed:
    def __init__(self, read_fd: int, write_fd: int):
        self.answers = os.fdopen(read_fd, "r")
        self.requests = os.fdopen(write_fd, "w", buffering=1)
        self.exhausted = False
        self.waited_at = 0.0

    def next(self) -> str | None:
        """A shard to open, or None: for now (after a "wait") or for good (then `exhausted`)."""
        if self.exhausted or time.time() - self.waited_at < ASK_EVERY:
            return None
        answer = self.ask("next")
        if answer == WAIT:
            self.waited_at = time.time()
            return None
        if not answer:
            self.exhausted = True
            return None
        return answer

    def finished(self, shard: str) -> None:
        self.send(f"done {shard}")

    def ask(self, request: str) -> str:
        if not self.send(request):
            return ""
        return self.answers.readline().strip()

    def send(self, line: str) -> bool:
        try:
            self.requests.write(line + "\n")
            return True
        except (BrokenPipeError, ValueError):  # the driver is gone
            self.exhausted = True
            return False
