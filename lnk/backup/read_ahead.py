"""The walk's items handed on in walk order, while the second process reads the small
files among them ahead of the backup's own thread (``small_reads.py``).

Each small file the walk finds goes into a batch of paths; a full batch is sent to
the process, and the backup's thread goes on walking.  Items are handed on in the
order the walk gave them: a file read ahead once its batch is answered, anything
else once everything before it was handed on.  At most ``AHEAD`` items, and small
files of ``AHEAD_BYTES`` as walked, wait: that bounds what is held (their paths, and
their answers).  The depth is what keeps both processes busy: at 4 batches each
waited for the other (2.4 s of the backup's thread, 1.8 s of the process, of a
12.1 s first backup of 100,000 files), at 16 batches half as long (11.0 s), and
deeper gave nothing more.
Until the process runs (a run's first few batches of chunks, ``sealer.START_AFTER``),
every item is handed on at once and read on the backup's thread, as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from lnk.backup.sealer import Reads, SealProcess
from lnk.backup.small_reads import SmallRead
from lnk.payload.walk import WalkedFile

BATCH_ITEMS = 128  # small files read in one request
BATCH_BYTES = 1 << 20  # ... or this many bytes of them, as walked
AHEAD = 16 * BATCH_ITEMS  # items walked and not yet handed on
AHEAD_BYTES = 8 << 20  # small files walked and not yet handed on, by their size


class _Batch:
    __slots__ = ("fut", "paths", "size")

    def __init__(self) -> None:
        self.paths: list[bytes] = []
        self.size = 0
        self.fut: Future[Reads] | None = None


class ReadAhead:
    """Hands each walked item to ``handle`` in walk order, with what the second process
    (``reader()``, None until it runs) read of it when ``readable`` gave its path."""

    def __init__(
        self,
        reader: Callable[[], SealProcess | None],
        readable: Callable[[WalkedFile], bytes | None],
        handle: Callable[[WalkedFile, SmallRead | None], None],
    ) -> None:
        self._reader, self._readable, self._handle = reader, readable, handle
        self._items: deque[tuple[WalkedFile, _Batch | None, int]] = deque()
        self._open: _Batch | None = None  # filling, not sent yet
        self._proc: SealProcess | None = None
        self._bytes = 0  # the size of the small files waiting

    def push(self, f: WalkedFile) -> None:
        proc = self._reader()
        path = self._readable(f) if proc is not None else None
        if path is None:
            if not self._items:
                self._handle(f, None)  # nothing waits before it
                return
            self._items.append((f, None, 0))
        else:
            self._proc = proc
            b = self._open
            if b is None:
                b = self._open = _Batch()
            self._items.append((f, b, len(b.paths)))
            b.paths.append(path)
            b.size += f.size
            self._bytes += f.size
            if len(b.paths) >= BATCH_ITEMS or b.size >= BATCH_BYTES:
                self._send()
        self._flow(end=False)

    def finish(self) -> None:
        """Hand on everything still waiting."""
        self._flow(end=True)

    def _send(self) -> None:
        b, self._open = self._open, None
        assert b is not None and self._proc is not None
        b.fut = self._proc.read(b.paths)
        b.paths = []

    def _flow(self, end: bool) -> None:
        items = self._items
        while items:
            must = end or len(items) >= AHEAD or self._bytes >= AHEAD_BYTES
            f, b, i = items[0]
            r = None
            if b is not None:
                if b.fut is None:
                    if not must:
                        return
                    self._send()
                    assert b.fut is not None
                if not (must or b.fut.done()):
                    return
                r = b.fut.result()[i]
                self._bytes -= f.size
            items.popleft()
            self._handle(f, r)
