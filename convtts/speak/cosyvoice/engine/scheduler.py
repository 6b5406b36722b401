"""Which sequences hold the decode's rows: admission into free rows, decoded rows waiting for the flow, chunks
chained."""

from __future__ import annotations

import heapq
from collections import deque

from convtts.speak.base import FEED_WAIT
from convtts.speak.cosyvoice.engine.requests import DECODED, DONE, FAILED, RUNNING, ChunkStream, Request, Sequence


class Scheduler:
    """Requests in, sequences through rows, requests out.

    A request's text frontend may still be at work when it arrives (Request.pending): up to
    `ahead` requests beyond the free rows are taken early so that their frontend runs while the
    GPU decodes. A request's chunks decode one after the other, the next one once the flow has
    rendered the previous, so that they draw from the request's one random stream in upstream's
    order; with `together`, each chunk draws from a stream of its own (ChunkStream) and all of
    them wait for rows at once: a text of four chunks takes the time of its longest, not of the four
    and the flushes between them. The request is handed back once its last chunk is through the flow.
    """

    def __init__(self, max_rows: int, ratios: tuple[float, float], ahead: int = 0, together: bool = False):
        self.max_rows = max_rows
        self.min_ratio, self.max_ratio = ratios
        self.ahead = ahead
        self.together = together
        self.incoming: deque[Request] = deque()  # taken from the caller, frontend maybe under way
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.decoded: list[Sequence] = []
        self.failed: list[Request] = []  # refused before any decode, to hand back
        self.free = list(range(max_rows))  # free rows, lowest first
        self.exhausted = False

    # -- requests in ---------------------------------------------------------------------------
    def fill(self, source) -> None:
        """Take requests from `source` while rows (and the look-ahead) have room for them; FEED_WAIT from it
        means none now (the caller holds back the next ones): asked again at the next fill."""
        while not self.exhausted and self.outstanding() < self.max_rows + self.ahead:
            request = next(source, None)
            if request is None:
                self.exhausted = True
                return
            if request is FEED_WAIT:
                return
            self.incoming.append(request)

    def outstanding(self) -> int:
        return len(self.incoming) + len(self.waiting) + len(self.running)

    def admit(self) -> list[Sequence]:
        """Sequences that take a free row now, their rows assigned; waiting chunks go first.

        A request whose frontend is still at work is waited for only when nothing would decode
        otherwise; else it is looked at again after the next step.
        """
        admitted = []
        while self.free and (self.waiting or self.incoming):
            if not self.waiting and not self._arrive(block=not self.running):
                break
            if not self.waiting:
                continue
            seq = self.waiting.popleft()
            seq.status, seq.row = RUNNING, heapq.heappop(self.free)
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def _arrive(self, block: bool) -> bool:
        """Move the oldest incoming request to the waiting chunks (or to the failed); False if not ready."""
        request = self.incoming[0]
        if not (block or request.ready()):
            return False
        self.incoming.popleft()
        request.resolve()
        if request.error is not None or not request.chunks:  # the frontend failed, or no text
            request.error = request.error or RuntimeError("nothing to speak in the text")
            self.failed.append(request)
            return True
        request.next_chunk = len(request.chunks) if self.together else 1
        request.open = request.next_chunk
        self.waiting.extend(self.sequence(request, index) for index in range(request.next_chunk))
        return True

    def sequence(self, request: Request, index: int) -> Sequence:
        """A chunk's sequence, bounded as upstream bounds it: by the chunk's text tokens (not the prompt's)."""
        chunk = request.chunks[index]
        text_only = int(chunk["text"].shape[1])
        return Sequence(
            request,
            chunk,
            index,
            min_len=int(text_only * self.min_ratio),
            max_len=int(text_only * self.max_ratio),
            stream=ChunkStream.of(request, index) if self.together and index else None,
        )

    def take_failed(self) -> list[Request]:
        failed, self.failed = self.failed, []
        return failed

    # -- rows out --------------------------------------------------------------------------------
    def finish(self, seq: Sequence, failed: bool = False) -> None:
        """A running sequence leaves its row: decoded (for the flow) or failed."""
        self.running.remove(seq)
        heapq.heappush(self.free, seq.row)
        seq.status = FAILED if failed else DECODED
        self.decoded.append(seq)  # a failed one too: the flush hands its request back

    def abandon(self, seq: Sequence, error: BaseException) -> None:
        """A sequence whose prefill failed: it never ran; its request fails, handed back once no other
        chunk of it is in the decode or the flow (its chunks still waiting for a row are dropped)."""
        self.running.remove(seq)
        heapq.heappush(self.free, seq.row)
        seq.status, seq.request.error = FAILED, error
        dropped = [other for other in self.waiting if other.request is seq.request]
        for other in dropped:
            self.waiting.remove(other)
        seq.request.open -= 1 + len(dropped)
        if seq.request.open <= 0:
            self.failed.append(seq.request)

    def flow_due(self, flow_rows: int) -> bool:
        """Enough decoded rows for one flow pass; or, once no new chunk is at hand to take a freed row,
        as many decoded rows as are still running. Without that rule a worker's last rows would hold
        every row decoded before them (and the next chunk of each) until the slowest one ends: at the
        end of a run, tens of seconds."""
        if not self.decoded:
            return False
        if len(self.decoded) >= flow_rows:
            return True
        if self.waiting or self.incoming:
            return False
        return len(self.decoded) >= len(self.running)

    def drained(self) -> bool:
        """No request is left to take or to admit: the rows decoding now are the last of this call."""
        return self.exhausted and not (self.incoming or self.waiting)

    def take_decoded(self) -> list[Sequence]:
        decoded, self.decoded = self.decoded, []
        return decoded

    def complete(self, seq: Sequence) -> Request | None:
        """After the flow: queue the request's next chunk first in line, or hand the request back once
        its last chunk is through."""
        request = seq.request
        request.open -= 1
        if request.error is None and request.next_chunk < len(request.chunks):
            self.waiting.appendleft(self.sequence(request, request.next_chunk))
            request.next_chunk += 1
            request.open += 1
            seq.status = DONE
            return None
        seq.status = DONE if request.error is None else FAILED
        return request if request.open <= 0 else None

    def finished(self) -> bool:
        return self.exhausted and not (self.incoming or self.waiting or self.running or self.decoded or self.failed)
