"""Stream records out of a JSON array or JSON lines file, gzip or zstd too, with their byte spans, in
bounded memory; whether a record has a usable shape is plan/record_shapes.py's to say."""

from __future__ import annotations

import gzip
import io
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson

from convtts.plan.record_shapes import json_type, record_problem

CHUNK = 1 << 23  # bytes read at a time from a JSON array

# One match per bracket: runs of other bytes and whole string literals are skipped inside the
# regex engine, so the Python loop runs about a dozen times per LLaVA record. A lone '"' is a
# string cut off by the end of the buffer.
_NEXT_BRACKET = re.compile(rb'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+([\[\]{}"])', re.S)


# The same, for a whole record at once: a value nested up to 8 deep (a LLaVA record is 3), matched
# inside the regex engine. Bracket kinds are not paired here; orjson checks the record after.
def _nested(depth: int) -> bytes:
    string, other = rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', rb'[^"\[\]{}]++'
    inner = rb"(?:" + other + rb"|" + string + rb")*+"
    for _ in range(depth):
        value = rb"[\[{]" + inner + rb"[\]}]"
        inner = rb"(?:" + other + rb"|" + string + rb"|" + value + rb")*+"
    return value


_RECORD = re.compile(_nested(8), re.S)
_SCALAR = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[^\s,\[\]{}"]++')
_SPACE = re.compile(rb"[ \t\r\n]*+")
_BOM = b"\xef\xbb\xbf"


class InputError(Exception):
    """The input file cannot be used at all; the message says where and why."""


def scan(path: str | Path) -> Iterator[tuple[int, int, object]]:
    """Yield (byte offset, byte length, parsed value) for each top-level record, in file order.

    A file whose first non-blank byte is '[' is one JSON array; anything else is read as JSON
    lines, one value a line (blank lines are ignored). A gzip or zstd file is read through its
    decompressed bytes, which the offsets count.
    """
    with _open(path) as fh:
        first = fh.read(4096).lstrip(_BOM + b" \t\r\n")[:1]
    if not first:
        raise InputError(f"{path}: the input file is empty")
    with _open(path) as fh:  # opened again: a compressed stream does not seek back
        yield from (_scan_array(fh, path) if first == b"[" else _scan_lines(fh, path))


def records(path: str | Path) -> Iterator[tuple[int, int, int, object, str | None]]:
    """(index, offset, length, value, problem) for each top-level value, in file order.

    `problem` says why a value is not a usable conversation record (None when it is): such
    records are the caller's to report as skipped. InputError comes at the end when none is usable.
    """
    kinds: Counter = Counter()
    first_problem, usable = None, 0
    for index, (offset, length, value) in enumerate(scan(path)):
        kinds[json_type(value)] += 1
        problem = record_problem(value)
        usable += problem is None
        first_problem = first_problem or (problem and f"record {index}: {problem}")
        yield index, offset, length, value, problem
    if not kinds:
        raise InputError(f"{path}: the file holds no records (an empty array?)")
    if not kinds["an object"]:
        found = ", ".join(f"{n} x {kind}" for kind, n in kinds.most_common())
        raise InputError(
            f"{path}: expected a JSON array of conversation records or one record object per line, "
            f"but found no object ({found})"
        )
    if not usable:
        raise InputError(
            f"{path}: no record has a usable conversation: a 'conversations' or 'messages' list, or Alpaca's "
            f"'instruction' and 'output' ({sum(kinds.values())} read; {first_problem})"
        )


def read_spans(path: str | Path, spans: Iterable[tuple[int, int]]) -> Iterator[bytes]:
    """The raw bytes of the records at the given (offset, length) spans, as found by `scan`.

    Spans in file order read sequentially: a seek inside the read buffer costs no system call. A
    compressed file is decompressed again on the way, the bytes between spans read and dropped.
    """
    with _open(path) as fh:
        position = 0
        for offset, length in spans:
            if fh.seekable():
                fh.seek(offset)
            else:
                _skip(fh, offset - position)
            position = offset + length
            yield fh.read(length)


def _skip(fh, size: int) -> None:
    while size > 0:
        block = fh.read(min(size, CHUNK))
        if not block:
            return
        size -= len(block)


# The first bytes of a compressed file, whatever its name: a .json that is gzip'ed reads as well.
GZIP_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"


def _open(path: str | Path):
    """The file's bytes, decompressed when it is gzip or zstd (such a stream reads straight through
    and does not seek)."""
    try:
        raw = open(path, "rb", buffering=1 << 20)
    except FileNotFoundError:
        raise InputError(f"input file not found: {path}") from None
    except IsADirectoryError:
        raise InputError(f"input path is a directory, not a file: {path}") from None
    except OSError as exc:
        raise InputError(f"cannot read input file {path}: {exc.strerror or exc}") from None
    magic = raw.peek(4)[:4]
    if magic.startswith(GZIP_MAGIC):
        stream = _Decompressed(gzip.GzipFile(fileobj=raw, mode="rb"), raw, path, "gzip", _GZIP_ERRORS)
    elif magic == ZSTD_MAGIC:
        reader, errors = _zstd_reader(raw, path)
        stream = _Decompressed(reader, raw, path, "zstd", errors)
    else:
        return raw
    return io.BufferedReader(stream, 1 << 20)


_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def _zstd_reader(raw, path) -> tuple:
    """(decompressing reader, its errors): Python's own zstd (3.14 on), else zstandard's."""
    try:
        from compression import zstd

        return zstd.ZstdFile(raw), (EOFError, zstd.ZstdError)
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        raw.close()
        raise InputError(
            f"{path} is zstd-compressed: reading it needs the zstandard package "
            "(pip install 'convtts[zstd]'), or decompress it first (zstd -d)"
        ) from None
    return _ZstdFrames(raw, zstandard), (EOFError, zstandard.ZstdError)


class _ZstdFrames(io.RawIOBase):
    """zstandard's decompression of frame after frame (`cat a.zst b.zst`), which, unlike its
    stream_reader, tells a file cut off inside a frame from one that ends."""

    def __init__(self, raw, zstandard):
        self.raw, self.frame = raw, zstandard.ZstdDecompressor(max_window_size=1 << 31).decompressobj
        self.obj, self.inside = self.frame(), False
        self.out, self.at = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.at == len(self.out):
            data = self.raw.read(1 << 20)
            if not data:
                if self.inside:
                    raise EOFError("the file ends inside a zstd frame")
                return 0
            self.out, self.at = self._decompress(data), 0
        size = min(len(buffer), len(self.out) - self.at)
        buffer[:size] = memoryview(self.out)[self.at : self.at + size]
        self.at += size
        return size

    def _decompress(self, data: bytes) -> bytes:
        parts = []
        while data:
            if self.obj.eof:
                self.obj = self.frame()
            parts.append(self.obj.decompress(data))
            data = self.obj.unused_data if self.obj.eof else b""
        self.inside = not self.obj.eof
        return b"".join(parts)


class _Decompressed(io.RawIOBase):
    """A decompressing reader whose damaged or cut-off data is an InputError naming the file."""

    def __init__(self, stream, raw, path, kind: str, errors: tuple):
        self.stream, self.raw, self.path, self.kind, self.errors = stream, raw, path, kind, errors

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            return self.stream.readinto(buffer)
        except self.errors as exc:
            raise InputError(f"{self.path}: the {self.kind} data is damaged or cut off ({exc})") from None

    def close(self) -> None:
        if not self.closed:
            self.stream.close()
            self.raw.close()
        super().close()


def _scan_lines(fh, path) -> Iterator[tuple[int, int, object]]:
    offset = 0
    for lineno, line in enumerate(fh, 1):
        if lineno == 1 and line.startswith(_BOM):
            line, offset = line[3:], 3
        if line.strip():
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                hint = ""
                if lineno == 1 and line.strip() in (b"{", b"["):
                    hint = " (a pretty-printed single object? records must be a JSON array or one per line)"
                raise InputError(
                    f"{path}: invalid JSON on line {lineno}, column {exc.colno}: {exc.msg}{hint}"
                ) from None
            yield offset, len(line), value
        offset += len(line)


class _Window:
    """A sliding window over the file: `buf` holds the bytes from file offset `base` on."""

    def __init__(self, fh, path):
        self.fh, self.path = fh, path
        self.buf, self.base, self.eof = b"", 0, False

    def more(self, keep: int) -> int:
        """Drop the bytes before `keep`, append the next chunk; return how far positions moved."""
        want = max(CHUNK, len(self.buf) - keep)  # a record longer than a chunk doubles the read
        chunk = self.fh.read(want)
        self.buf = self.buf[keep:] + chunk
        self.base += keep
        self.eof = len(chunk) < want
        return keep

    def skip_space(self, pos: int) -> int:
        """Position of the next non-blank byte (len(buf) only at the end of the file)."""
        while True:
            pos = _SPACE.match(self.buf, pos).end()
            if pos < len(self.buf) or self.eof:
                return pos
            pos -= self.more(pos)

    def element(self, start: int) -> tuple[int, int]:
        """(start, end) of the value beginning at `start`; positions are in the (moved) window."""
        if self.buf[start] not in b"[{":
            return self._scalar(start)
        whole = _RECORD.match(self.buf, start)
        if whole:
            return start, whole.end()
        depth, pos = 0, start  # deeper than 8, cut off by the end of the window, or broken
        while True:
            m = _NEXT_BRACKET.match(self.buf, pos)
            if m is None or self.buf[m.end() - 1] == ord('"'):  # the window ends inside this record
                if self.eof:
                    raise self.error(start, "a record is cut off by the end of the file")
                moved = self.more(start)
                start, pos = 0, pos - moved
                continue
            pos = m.end()
            depth += 1 if self.buf[pos - 1] in b"[{" else -1
            if depth == 0:
                return start, pos

    def _scalar(self, start: int) -> tuple[int, int]:
        while True:
            m = _SCALAR.match(self.buf, start)
            if m and (m.end() < len(self.buf) or self.eof):
                return start, m.end()
            if self.eof:
                raise self.error(start, "expected a value")
            start -= self.more(start)

    def error(self, pos: int, what: str) -> InputError:
        return InputError(f"{self.path}: invalid JSON {where(self.path, self.base + pos)}: {what}")


def _scan_array(fh, path) -> Iterator[tuple[int, int, object]]:
    win = _Window(fh, path)
    win.more(0)
    pos = win.skip_space(len(_BOM) if win.buf.startswith(_BOM) else 0) + 1  # just after the '['
    after_comma, expect_value = False, True
    while True:
        pos = win.skip_space(pos)
        if pos >= len(win.buf):
            raise win.error(pos, "the array is not closed with ']'")
        char = win.buf[pos : pos + 1]
        if char == b"]":
            if after_comma:
                raise win.error(pos, "expected a record after ',' but found ']'")
            return _expect_end(win, pos + 1)
        if not expect_value:
            if char != b",":
                raise win.error(pos, "expected ',' or ']' after a record")
            pos, after_comma, expect_value = pos + 1, True, True
            continue
        start, end = win.element(pos)
        yield win.base + start, end - start, _parse(win, start, end)
        pos, after_comma, expect_value = end, False, False


def _parse(win: _Window, start: int, end: int) -> object:
    try:
        return orjson.loads(win.buf[start:end])
    except orjson.JSONDecodeError as exc:
        data = win.buf[start:end]
        inner = len(data.decode("utf-8", "replace")[: exc.pos].encode())  # orjson counts characters
        raise win.error(start + inner, exc.msg) from None


def _expect_end(win: _Window, pos: int) -> None:
    pos = win.skip_space(pos)
    if pos < len(win.buf):
        raise win.error(pos, "unexpected data after the closing ']' of the array")


def where(path: str | Path, offset: int) -> str:
    """'at line 12, column 5 (byte 301)': count the lines only when there is an error to report."""
    line, last_newline, done = 1, -1, 0
    with _open(path) as fh:
        while done < offset:
            block = fh.read(min(CHUNK, offset - done))
            if not block:
                break
            line += block.count(b"\n")
            cut = block.rfind(b"\n")
            if cut >= 0:
                last_newline = done + cut
            done += len(block)
    return f"at line {line}, column {offset - last_newline} (byte {offset})"
