"""Write a sealed stream (format 4) in bounded memory.

    with StreamWriter(out, recipient, {"kind": "move"}) as w:
        w.write(0x01, b"...")              # each body at most RECORD_MAX bytes
    summary = w.summary

Records are compressed and sealed in a small thread pool, a few at a time,
and always go out in order.  This module also holds what both ends share:
the :class:`StreamSummary` of a complete stream and the pipe and pool
helpers; ``reader.py`` reads what this writes.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, BinaryIO

from lnk.errors import InvalidInput, StreamError
from lnk.formats import header as H
from lnk.formats import records as R
from lnk.formats.keys import PublicKey

RECORD_MAX = H.RECORD_MAX
FORMAT = H.FORMAT

__all__ = [
    "FORMAT",
    "RECORD_MAX",
    "StreamSummary",
    "StreamWriter",
    "split_body",
]


@dataclass(frozen=True)
class StreamSummary:
    """What the final record says about a complete stream."""

    stream_id: bytes
    header_hash: bytes  # HH, SHA-256 of the whole header
    records: int  # records before the final one
    body_bytes: int  # sum of their (uncompressed) body lengths
    root: bytes  # SHA-256(h_0 ‖ … ‖ h_{n-1}), h_i = SHA-256(rtype ‖ body)
    wire_bytes: int  # bytes of the whole stream


def split_body(
    data: bytes | bytearray | memoryview, size: int = RECORD_MAX
) -> Iterator[memoryview]:
    """Cut data into consecutive pieces of at most ``size`` bytes (none if empty)."""
    view = memoryview(data)
    for start in range(0, len(view), size):
        yield view[start : start + size]


def grow_pipe(f: Any) -> None:
    """Make a pipe hold a whole record (Linux), so both ends of a pipeline overlap."""
    try:
        fd = f.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass  # not a pipe, or above pipe-max-size: fine as it is


def done_future(value: Any = None, exc: BaseException | None = None) -> Future[Any]:
    fut: Future[Any] = Future()
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)
    return fut


class StreamWriter:
    """Seal records to ``recipient`` onto ``out``; ``close()`` writes the final record.

    ``rng`` (default ``os.urandom``) draws the stream id and the stream key; a
    test-vector generator injects a seeded one.  Nothing else is random except
    HPKE's own encapsulation.
    """

    def __init__(
        self,
        out: BinaryIO,
        recipient: PublicKey,
        meta: dict[str, Any] | None = None,
        *,
        level: int | None = 3,
        workers: int = 2,
        rng: Callable[[int], bytes] | None = None,
    ) -> None:
        draw = rng or os.urandom
        meta_bytes = H.canonical_meta(meta if meta is not None else {})
        stream_id, stream_key = draw(16), draw(32)
        self._header = H.build_header(
            recipient.raw, recipient.hpke_key, meta_bytes, stream_id, stream_key
        )
        self._keys = R.Keys(stream_key, self._header)
        self._out = out
        grow_pipe(out)
        self._level = level
        self._pool = ThreadPoolExecutor(workers, "lnk-seal") if workers > 1 else None
        self._max_inflight = max(2, 2 * workers)
        self._inflight: deque[Future[tuple[bytes | bytearray, bytes]]] = deque()
        self._index = 0
        self._total = 0
        self._root = hashlib.sha256()
        self._wire = 0
        self._state = "open"
        self.summary: StreamSummary | None = None
        self._emit(self._header.raw)

    @property
    def stream_id(self) -> bytes:
        return self._header.stream_id

    @property
    def header_hash(self) -> bytes:
        return self._header.hh

    def _emit(self, data: bytes | bytearray) -> None:
        self._out.write(data)
        self._wire += len(data)

    def _drain_one(self) -> None:
        wire, h = self._inflight.popleft().result()
        self._emit(wire)
        self._root.update(h)

    def write(self, rtype: int, body: bytes | bytearray | memoryview) -> None:
        """Add one record: a type in 0x00-0x7E and a body of at most RECORD_MAX bytes."""
        if self._state != "open":
            raise StreamError(f"this stream writer is {self._state}; it takes no more records")
        if not 0 <= rtype < R.RTYPE_FINAL:
            raise InvalidInput(f"record type {rtype:#x} is not one a caller may use (0x00-0x7E)")
        if len(body) > RECORD_MAX:
            raise InvalidInput(
                f"a record body is at most {RECORD_MAX} bytes, not {len(body)}",
                hint="split it with lnk.formats.stream.split_body",
            )
        if self._index >= R.MAX_RECORDS:
            raise InvalidInput("a stream holds at most 2^48 records")
        data = bytes(body)  # our own copy: the caller may reuse its buffer
        try:
            if self._pool is None:
                self._inflight.append(
                    done_future(R.seal_record(self._keys, self._index, rtype, data, self._level))
                )
            else:
                self._inflight.append(
                    self._pool.submit(
                        R.seal_record, self._keys, self._index, rtype, data, self._level
                    )
                )
            self._index += 1
            self._total += len(data)
            while len(self._inflight) >= self._max_inflight:
                self._drain_one()
        except BaseException:
            self.abort()
            raise

    def write_from(self, rtype: int, inp: BinaryIO) -> int:
        """Read ``inp`` to its end as records of ``rtype``; return the bytes read."""
        n = 0
        while True:
            chunk = H.read_exact(inp, RECORD_MAX)
            if not chunk:
                return n
            self.write(rtype, chunk)
            n += len(chunk)

    def flush(self) -> None:
        """Put every record written so far onto ``out`` and flush it, so the reader has
        them now, not when more follow (a receiver starts its own work on a HEAD)."""
        if self._state != "open":
            raise StreamError(f"this stream writer is {self._state}")
        try:
            while self._inflight:
                self._drain_one()
            self._out.flush()
        except BaseException:
            self.abort()
            raise

    def close(self) -> StreamSummary:
        """Write what is in flight and the final record, flush; return the summary."""
        if self.summary is not None:
            return self.summary
        if self._state != "open":
            raise StreamError(f"this stream writer is {self._state}")
        try:
            while self._inflight:
                self._drain_one()
            root = self._root.digest()
            body = R.final_body(self._index, self._total, root)
            pt = bytes((R.RTYPE_FINAL, R.CODEC_RAW)) + body
            self._emit(R.seal_raw(self._keys, self._index, pt, final=True))
            self._out.flush()
        except BaseException:
            self.abort()
            raise
        self._shutdown()
        self._state = "closed"
        self.summary = StreamSummary(
            self._header.stream_id, self._header.hh, self._index, self._total, root, self._wire
        )
        return self.summary

    def abort(self) -> None:
        """Stop without a final record: any reader will refuse the stream as cut short."""
        if self._state == "open":
            self._state = "aborted"
        self._inflight.clear()
        self._shutdown()

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
