"""Read a sealed stream (format 4) in bounded memory.

    reader = StreamReader(inp, receiver_key)
    reader.meta                             # verified cleartext metadata
    for rtype, body in reader:              # ends normally only when complete
        ...

Records are opened and decompressed in a small thread pool, a few at a time,
and always come out in order.  ``peek_format`` tells a stream's format number
without consuming it.  ``stream.py`` writes what this reads.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

from lnk.errors import StreamError
from lnk.formats import header as H
from lnk.formats import records as R
from lnk.formats.keys import ReceiverKey
from lnk.formats.stream import FORMAT, StreamSummary, done_future, grow_pipe


@dataclass(frozen=True)
class _Final:
    index: int
    ct: bytes


class StreamReader:
    """Verify a stream's header now; iterate to get ``(rtype, body)`` records in order.

    The iteration ends normally only after the final record has verified and
    end of input follows it; any problem raises a :class:`StreamError`
    (``header.StreamFault`` with a ``kind``, or ``FormatMismatch``).
    Records yielded before an error must be treated as unverified.
    """

    def __init__(self, inp: BinaryIO, key: ReceiverKey, *, workers: int = 2) -> None:
        self._inp = inp
        grow_pipe(inp)
        self._header, stream_key = H.read_header(inp, key.hpke_private, key.key_id)
        self.meta: dict[str, Any] = H.parse_meta(self._header.meta_bytes)
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
                # the first record goes out as it arrives, not once more follow (a
                # payload's HEAD: the caller starts its own work by it while the rest comes)
                while len(pending) > (lookahead if self._n else 0):
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
            word = H.read_exact(self._inp, 4)
            if not word:
                last = f"after record {index - 1}" if index else "after its header"
                raise H.StreamFault(
                    "truncated",
                    f"the stream ends {last} without its final record: it was cut short",
                    hint="the sender stopped or the connection dropped; send it again",
                )
            if len(word) < 4:
                raise self._cut(index)
            length, final = R.parse_word(word, index, limit)
            ct = H.read_exact(self._inp, length)
            if len(ct) < length:
                raise self._cut(index)
            self._wire += 4 + length
            if final:
                yield _Final(index, ct)
                if self._inp.read(1):
                    raise H.StreamFault(
                        "trailing",
                        "there are bytes after the stream's final record",
                        hint="something appended to the stream; send it again",
                    )
                return
            if pool is None:
                try:
                    yield done_future(R.open_record(self._keys, index, ct, False, limit))
                except StreamError as exc:
                    yield done_future(exc=exc)
            else:
                yield pool.submit(R.open_record, self._keys, index, ct, False, limit)
            index += 1

    @staticmethod
    def _cut(index: int) -> H.StreamFault:
        return H.StreamFault(
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
            raise H.StreamFault(
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
        head = H.read_exact(inp, 10)
        inp.seek(pos)
    else:
        raise ValueError("peek_format needs a stream with peek() or seek()")
    try:
        H.check_prelude(head)
    except H.StreamFault:
        raise
    except StreamError:
        pass  # another format: say which
    return int.from_bytes(head[8:10], "big")
