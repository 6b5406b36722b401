"""A slot's worker processes: how they start (workers.start_method, the forkserver's preload), the handle
the slot keeps of each, and how they are ended."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from convtts.config import Config
from convtts.run.pieces import Piece
from convtts.speak import Resources


@dataclass
class Handle:
    wid: int
    proc: object
    conn: object
    ready: bool = False
    pieces: list = field(default_factory=list)  # Pieces handed to it and not finished
    wants: bool = False  # asked for more and has no answer yet
    room: int = 0  # how many ids it asked for (0: as many as the work cuts)
    asked_back: bool = False  # a HandBack is out to it
    stopping: bool = False  # told to stop
    spoke: bool = False  # finished at least one utterance since it started

    def piece_of(self, uid: str) -> Piece | None:
        """The piece it is speaking `uid` for (an id handed back may come to it again in a later piece)."""
        return next((p for p in self.pieces if uid in p.ids and uid in p.unreported()), None)

    def unstarted(self) -> int:
        return sum(len(p.unstarted()) for p in self.pieces)

    def tell(self, message) -> bool:
        """Send `message`; False when the worker died since the last pump (its sentinel reports it next)."""
        try:
            self.conn.send(message)
        except OSError:  # BrokenPipeError, ConnectionResetError: the pipe's other end is gone
            return False
        return True


def end(procs: list, grace: float = 10.0) -> None:
    """Terminate these processes, wait up to `grace` seconds for them all, then kill the ones left."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.time() + grace
    for proc in procs:
        proc.join(timeout=max(0.1, deadline - time.time()))
        if proc.is_alive():
            proc.kill()
            proc.join()


def worker_context(config: Config, needs: Resources):
    """How the workers start (workers.start_method; auto: as their voice asks): forked from a server
    that imported torch and the voice's modules once (run/preload.py), or spawned, each importing for
    itself. Never plain fork: a forked copy of a process that may hold CUDA state cannot use CUDA."""
    import multiprocessing

    from convtts.run import preload

    method = config.workers.start_method
    if method == "auto":
        method = needs.start_method
    if method == "forkserver" and not _forkserver_serves(preload.plan(config, needs)):
        method = "spawn"
    return multiprocessing.get_context(method)


_forkserver_plan: list[str] = []  # what this process's forkserver preloads, once it is set up


def _forkserver_serves(wanted: str) -> bool:
    """Set up the forkserver's preload for `wanted`; False if this platform has no forkserver, or this
    process's server already runs with another preload (a second slot in one process, as in tests)."""
    import multiprocessing

    from convtts.run import preload

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    if _forkserver_plan:
        return _forkserver_plan[0] == wanted
    os.environ[preload.ENV] = wanted  # the server starts with this process's environment
    multiprocessing.get_context("forkserver").set_forkserver_preload(["convtts.run.preload"])
    _forkserver_plan.append(wanted)
    return True
