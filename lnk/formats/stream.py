"""Write and read a sealed stream (format 4) in bounded memory.

    with StreamWriter(out, recipient, {"kind": "move"}) as w:
        w.write(0x01, b"...")              # each body at most RECORD_MAX bytes
    summary = w.summary

    reader = StreamReader(inp, receiver_key)
    reader.meta                             # verified cleartext metadata
    for rtype, body in reader:              # ends normally only when complete
        ...

Records are compressed and sealed (or opened and decompressed) in a small
thread pool, a few at a time, and always go out in order.
"""

from __future__ import annotations

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
from lnk.formats import records as R
from lnk.formats.keys import PublicKey, ReceiverKey

RECORD_MAX = R.RECORD_MAX
FORMAT = R.FORMAT

__all__ = [
    "FORMAT",
    "RECORD_MAX",
    "StreamReader",
    "StreamSummary",
    "StreamWriter",
    "peek_format",
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


def _grow_pipe(f: Any) -> None:
    """Make a pipe hold a whole record (Linux), so both ends of a pipeline overlap."""
    try:
        import fcntl

        fd = f.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (AttributeError, ImportError, OSError, ValueError, io.UnsupportedOperation):
        pass  # not a pipe, not Linux, or above pipe-max-size: fine as it is


def _done(value: Any = None, exc: BaseException | None = None) -> Future[Any]:
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
        meta_bytes = R.canonical_meta(meta if meta is not None else {})
        stream_id, stream_key = draw(16), draw(32)
        self._header = R.build_header(
            recipient.raw, recipient.hpke_key, meta_bytes, stream_id, stream_key
        )
        self._keys = R.Keys(stream_key, self._header)
        self._out = out
        _grow_pipe(out)
        self._level = level
        self._pool = ThreadPoolExecutor(workers, "lnk-seal") if workers > 1 else None
        self._max_inflight = max(2, 2 * workers)
        self._inflight: deque[Future[tuple[bytes, bytes]]] = deque()
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

    def _emit(self, data: bytes) -> None:
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
                    _done(R.seal_record(self._keys, self._index, rtype, data, self._level))
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
            chunk = R.read_exact(inp, RECORD_MAX)
            if not chunk:
                return n
            self.write(rtype, chunk)
            n += len(chunk)

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


@dataclass(frozen=True)
class _Final:
    index: int
    ct: bytes


class StreamReader:
    """Verify a stream's header now; iterate to get ``(rtype, body)`` records in order.

    The iteration ends normally only after the final record has verified and
    end of input follows it; any problem raises a :class:`StreamError`
    (``records.StreamFault`` with a ``kind``, or ``FormatMismatch``).
    Records yielded before an error must be treated as unverified.
    """

    def __init__(self, inp: BinaryIO, key: ReceiverKey, *, workers: int = 2) -> None:
        self._inp = inp
        _grow_pipe(inp)
        self._header, stream_key = R.read_header(inp, key.hpke_private, key.key_id)
        self.meta: dict[str, Any] = R.parse_meta(self._header.meta_bytes)
        self._keys = R.Keys(stream_key, self._header)
        self._workers = workers
        self._started = False
        self._root = hashlib.sha256()
        self._n = 0
        self._total = 0
        self._wire = len(self._header.raw)
        self.summary: StreamSummary | None = None

    format = FORMAT

    @property
    def stream_id(self) -> bytes:
        return self._header.stream_id

    @property
    def header_hash(self) -> bytes:
        return self._header.hh

    @property
    def complete(self) -> bool:
        return self.summary is not None

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        if self._started:
            raise StreamError("a stream can be read only once")
        self._started = True
        return self._records()

    def _records(self) -> Iterator[tuple[int, bytes]]:
        pool = ThreadPoolExecutor(self._workers, "lnk-open") if self._workers > 1 else None
        lookahead = max(1, 2 * self._workers)
        pending: deque[Future[tuple[int, bytes, bytes]] | _Final] = deque()
        error: StreamError | None = None
        scan = self._scan(pool)
        try:
            while True:
                # only a fault of the framing ahead is held back (earlier records' problems
                # are reported first); a record that does not open raises at its turn, so
                # nothing after it reaches the caller
                try:
                    item = next(scan)
                except StopIteration:
                    break
                except StreamError as exc:
                    error = exc
                    break
                pending.append(item)
                while len(pending) > lookahead:
                    yield from self._complete(pending.popleft())
            while pending:
                yield from self._complete(pending.popleft())
            if error is not None:
                raise error
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _scan(
        self, pool: ThreadPoolExecutor | None
    ) -> Iterator[Future[tuple[int, bytes, bytes]] | _Final]:
        """Read records off the wire (framing checks only); hand out their openings."""
        limit = self._header.record_max
        index = 0
        while True:
            word = R.read_exact(self._inp, 4)
            if not word:
                last = f"after record {index - 1}" if index else "after its header"
                raise R.StreamFault(
                    "truncated",
                    f"the stream ends {last} without its final record: it was cut short",
                    hint="the sender stopped or the connection dropped; send it again",
                )
            if len(word) < 4:
                raise self._cut(index)
            length, final = R.parse_word(word, index, limit)
            ct = R.read_exact(self._inp, length)
            if len(ct) < length:
                raise self._cut(index)
            self._wire += 4 + length
            if final:
                yield _Final(index, ct)
                if self._inp.read(1):
                    raise R.StreamFault(
                        "trailing",
                        "there are bytes after the stream's final record",
                        hint="something appended to the stream; send it again",
                    )
                return
            if pool is None:
                try:
                    yield _done(R.open_record(self._keys, index, ct, False, limit))
                except StreamError as exc:
                    yield _done(exc=exc)
            else:
                yield pool.submit(R.open_record, self._keys, index, ct, False, limit)
            index += 1

    @staticmethod
    def _cut(index: int) -> R.StreamFault:
        return R.StreamFault(
            "truncated",
            f"the stream ends in the middle of record {index}: it was cut short",
            hint="the sender stopped or the connection dropped; send it again",
        )

    def _complete(
        self, item: Future[tuple[int, bytes, bytes]] | _Final
    ) -> Iterator[tuple[int, bytes]]:
        if isinstance(item, _Final):
            self._finish(item)
            return
        rtype, body, h = item.result()
        self._root.update(h)
        self._n += 1
        self._total += len(body)
        yield rtype, body

    def _finish(self, item: _Final) -> None:
        _rt, body, _h = R.open_record(self._keys, item.index, item.ct, True, 0)
        n, total, root = R._FINAL.unpack(body)
        mine = self._root.digest()
        if item.index != self._n or n != self._n or total != self._total or root != mine:
            raise R.StreamFault(
                "payload",
                f"the final record does not match the stream (it counts {n} records and "
                f"{total} bytes; {self._n} records and {self._total} bytes arrived)",
                hint="the sender is not a compatible lnk, or the stream was forged",
            )
        self.summary = StreamSummary(
            self._header.stream_id, self._header.hh, n, total, root, self._wire
        )


def peek_format(inp: BinaryIO) -> int:
    """The format number of a stream, without consuming it (needs ``peek`` or ``seek``).

    Raises StreamFault ``not-lnk``/``truncated`` for something that is not an
    lnk stream; does not raise FormatMismatch (compare with FORMAT yourself).
    """
    peek = getattr(inp, "peek", None)
    if peek is not None:
        head = bytes(peek(10)[:10])
    elif inp.seekable():
        pos = inp.tell()
        head = R.read_exact(inp, 10)
        inp.seek(pos)
    else:
        raise ValueError("peek_format needs a stream with peek() or seek()")
    try:
        R.check_prelude(head)
    except R.StreamFault:
        raise
    except StreamError:
        pass  # another format: say which
    return int.from_bytes(head[8:10], "big")
