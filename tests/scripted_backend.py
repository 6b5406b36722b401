"""A test backend for the retry and slot tests: a tone as long as the text, except that marked texts
fail, run short of memory, come back silent, fill the disk or kill the worker, on their first calls.

Read from the environment in each process, so a slot's spawned workers do what the test says:
  CONVTTS_TEST_SCRIPT  `WORD=ACTION:TIMES` items separated by commas: a text holding WORD meets
                       ACTION on its first TIMES calls (`all`: every call), counted over all processes
  CONVTTS_TEST_TALLY   a folder: WORD.count counts a word's calls, calls.jsonl lists every call
ACTION  error (SynthesisError) | oom (OutOfMemory) | silent (silence: the quality gate refuses it) |
        full (the disk is full) | kill (SIGKILL of the worker) | broken (batched: the batch raises)
WORD `@build` acts when a backend is built: `@build=kill:all` kills every worker before it is ready.

ScriptedBatchTone speaks through synthesize_many, CONVTTS_TEST_ROWS (3) utterances at a time.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
from pathlib import Path

import numpy as np
import orjson

from convtts.speak.base import Backend, BatchedBackend, OutOfMemory, Resources, SynthesisError

RATE = 16000
# As CUDA words it: a paragraph of allocator figures and advice
OOM_TEXT = (
    "CUDA out of memory (scripted). Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "1.06 GiB is free.\nOf the allocated memory 71.3 GiB is allocated by PyTorch. If reserved but unallocated "
    "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def read_script(text: str) -> dict[str, tuple[str, int | None]]:
    script = {}
    for item in filter(None, text.split(",")):
        word, _, rest = item.partition("=")
        action, _, times = rest.partition(":")
        script[word.strip()] = (action, None if times == "all" else int(times or 1))
    return script


class ScriptedTone(Backend):
    name = "scripted-tone"
    sample_rate = RATE
    builds = 0  # backends built in this process: a rebuild makes a new one

    def __init__(self, config):
        self.script = read_script(os.environ.get("CONVTTS_TEST_SCRIPT", ""))
        self.tally = Path(os.environ["CONVTTS_TEST_TALLY"])
        self.words_per_second = config.text.words_per_minute / 60
        ScriptedTone.builds += 1
        self.build = ScriptedTone.builds
        self.act("@build", "build", 0)

    def action(self, text: str) -> str | None:
        """The action the script gives this call of `text`, counting the call against its word."""
        for word, (action, times) in self.script.items():
            if word in text:
                fd = os.open(self.tally / f"{word}.count", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, b".")
                    earlier = os.fstat(fd).st_size - 1
                finally:
                    os.close(fd)
                if times is None or earlier < times:
                    return action
        return None

    def act(self, text: str, path: str, seed: int) -> str | None:
        """Log the call; kill, or raise what the script says; return the action left to the caller."""
        action = self.action(text)
        call = {"pid": os.getpid(), "build": self.build, "path": path, "text": text, "seed": seed, "action": action}
        with open(self.tally / "calls.jsonl", "ab") as log:
            log.write(orjson.dumps(call) + b"\n")
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "error":
            raise SynthesisError(f"scripted error: {text[:40]}")
        if action == "oom":
            raise OutOfMemory(OOM_TEXT)
        if action == "full":
            raise OSError(errno.ENOSPC, "No space left on device (scripted)")
        return action

    def tone(self, text: str, silent: bool) -> np.ndarray:
        seconds = max(len(text.split()), 1) / self.words_per_second
        t = np.arange(int(seconds * RATE)) / RATE
        return np.zeros_like(t, dtype=np.float32) if silent else (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)

    def synthesize(self, text: str, speaker: str, seed: int) -> np.ndarray:
        return self.tone(text, self.act(text, "one", seed) == "silent")

    def close(self) -> None:
        pass


class ScriptedBatchTone(ScriptedTone, BatchedBackend):
    """Pulls `batch_rows` items from the caller's feed, then answers each; a shared fault breaks them all."""

    def __init__(self, config):
        super().__init__(config)
        self.batch_rows = self.built_rows = self.resources(config, "cpu").rows

    @classmethod
    def resources(cls, config, device) -> Resources:
        return Resources(rows=int(os.environ.get("CONVTTS_TEST_ROWS", "3")))

    def synthesize_many(self, items):
        items = iter(items)
        while batch := list(itertools.islice(items, self.batch_rows)):
            results = []
            for key, text, _, seed in batch:
                try:
                    action = self.act(text, "many", seed)
                except SynthesisError as exc:  # OutOfMemory and a full disk are the batch's: they propagate
                    if isinstance(exc, OutOfMemory):
                        raise
                    results.append((key, exc))
                    continue
                if action == "broken":
                    raise RuntimeError("shared decode step broke (scripted)")
                results.append((key, self.tone(text, action == "silent")))
            yield from results

    def shrink_batch(self) -> int:
        self.batch_rows = max(1, self.batch_rows // 2)
        return self.batch_rows

    def grow_batch(self) -> int:
        self.batch_rows = min(self.built_rows, self.batch_rows * 2)
        return self.batch_rows
