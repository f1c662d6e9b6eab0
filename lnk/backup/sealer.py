"""A second process that compresses and seals a backup run's small chunks.

Small chunks (a source tree's files) are named on the backup's own thread and
sealed in batches of up to 1 MiB; zstd and AES-GCM on thousands of 8 KiB
pieces cost that thread about 40% of a first backup, and threads gave nothing
back (the GIL hand-offs cost more than the second core gave).  A process does:
``SealProcess`` runs ``python -c 'from lnk.backup.sealer import serve'`` with
two pipes, sends it the run's data key once, then batches; the batches come
back sealed, in order.  The packer still decides what is stored and where.

Frames (big-endian), parent to child: the opening ``key(32) ‖ u16 n ‖ repo
id(n) ‖ u8 level``; then ``"B" ‖ u32 count ‖ count x (u8 k ‖ kind(k) ‖
id(32) ‖ u32 n ‖ data(n))`` per batch, ``"E"`` to end.  Child to parent, per
batch: ``u32 count ‖ count x (u32 n ‖ sealed(n))``.

If the process cannot start or dies (kill -9 included), every batch it had not
answered, and every later one, is sealed here instead: the run goes on and
stores the same blobs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import subprocess
import sys
import threading
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

import zstandard

from lnk.backup import crypto
from lnk.backup.pack import seal_blob
from lnk.formats.header import read_exact

START_AFTER = 4  # batches sealed in-process before the process starts: a small run never
# pays its start (about 0.2 s, overlapped with the run)

Batch = list[tuple[str, bytes, bytes]]  # kind, blob ID, plaintext
Sealed = list[tuple[bytes, bytes | None]]  # blob ID, sealed blob

ANSWER_MAX = 4 << 20  # a sealed small chunk is at most 64 KiB and some bytes: a longer
# answer is not one of ours

_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding lnk/


def seal_batch(ctx: Any, cctx: zstandard.ZstdCompressor, repo_id: bytes, batch: Batch) -> Sealed:
    return [(i, seal_blob(ctx, cctx, repo_id, kind, i, data)) for kind, i, data in batch]


class SealProcess:
    """Batches sealed by a child process, in the order they were submitted."""

    def __init__(self, data_key: bytes, repo_id: bytes, level: int = 3) -> None:
        self._repo_id, self._level = repo_id, level
        self._ctx = crypto.aead(data_key)  # for batches sealed here (the child is gone)
        self._cctx: zstandard.ZstdCompressor | None = None
        self._lock = threading.Lock()
        self._here_lock = threading.Lock()
        self._waiting: deque[tuple[Batch, Future[Sealed]]] = deque()
        self._outbox: deque[tuple[Batch, Future[Sealed]] | None] = deque()
        self._more = threading.Condition(self._lock)
        self.broken = False  # the child failed: batches are sealed here
        self._closed = False
        code = f"import sys; sys.path.insert(0, {_ROOT!r}); from lnk.backup.sealer import serve; serve()"
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._to: IO[bytes] = self._proc.stdin
        self._from: IO[bytes] = self._proc.stdout
        self._opening = data_key + struct.pack(">H", len(repo_id)) + repo_id + bytes((level,))
        self._writer = threading.Thread(target=self._write, name="lnk-seal-send", daemon=True)
        self._reader = threading.Thread(target=self._read, name="lnk-seal-recv", daemon=True)
        self._writer.start()
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def submit(self, batch: Batch) -> Future[Sealed]:
        fut: Future[Sealed] = Future()
        with self._lock:
            if not self.broken:
                self._waiting.append((batch, fut))
                self._outbox.append((batch, fut))
                self._more.notify()
                return fut
        fut.set_result(self._here(batch))
        return fut

    def close(self) -> None:
        """End the child (it has answered everything asked by now, or is gone)."""
        with self._lock:
            self._closed = True
            self._outbox.append(None)
            self._more.notify()
        self._writer.join()
        self._reader.join()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    # ---- the two threads ------------------------------------------------------

    def _write(self) -> None:
        try:
            self._to.write(self._opening)
            while True:
                with self._lock:
                    while not self._outbox:
                        self._more.wait()
                    item = self._outbox.popleft()
                if item is None:
                    self._to.write(b"E")
                    break
                parts = [b"B", struct.pack(">I", len(item[0]))]
                for kind, blob_id, data in item[0]:
                    k = kind.encode()
                    parts += [bytes((len(k),)), k, blob_id, struct.pack(">I", len(data)), data]
                self._to.write(b"".join(parts))
        except OSError:
            self._fail()
        finally:
            with contextlib.suppress(OSError):
                self._to.close()

    def _read(self) -> None:
        try:
            while True:
                head = read_exact(self._from, 4)
                if not head:
                    break
                (count,) = struct.unpack(">I", head)
                sealed: list[bytes] = []
                for _ in range(count):
                    (n,) = struct.unpack(">I", _need(self._from, 4))
                    if n > ANSWER_MAX:
                        raise EOFError  # not an answer of ours: sealed here
                    sealed.append(_need(self._from, n))
                with self._lock:
                    if len(sealed) != len(self._waiting[0][0]):
                        raise EOFError  # not its answer: sealed here, with the rest
                    batch, fut = self._waiting.popleft()
                fut.set_result([(i, s) for (_k, i, _d), s in zip(batch, sealed, strict=True)])
        except (OSError, EOFError, struct.error, IndexError):
            pass
        with self._lock:
            if self._closed and not self._waiting:
                return  # it answered everything and ended as asked
        self._fail()

    def _fail(self) -> None:
        """The child is gone (or done): seal here whatever it did not answer."""
        with contextlib.suppress(OSError):
            self._proc.kill()  # gone or not answering as it should: the writer stops too
        with self._lock:
            self.broken = True
            left = list(self._waiting)
            self._waiting.clear()
            self._outbox.clear()
            self._outbox.append(None)
            self._more.notify()
        for batch, fut in left:
            if not fut.done():
                try:
                    fut.set_result(self._here(batch))
                except BaseException as e:  # handed to whoever waits
                    fut.set_exception(e)

    def _here(self, batch: Batch) -> Sealed:
        # the reader thread (a child's batches left unanswered) and the caller's (batches
        # submitted after) may both seal here; a zstd compressor takes one at a time
        with self._here_lock:
            if self._cctx is None:
                self._cctx = zstandard.ZstdCompressor(level=self._level)
            return seal_batch(self._ctx, self._cctx, self._repo_id, batch)


def _need(f: IO[bytes], n: int) -> bytes:
    got = read_exact(f, n)
    if len(got) != n:
        raise EOFError
    return got


def serve() -> None:
    """The child: seal each batch read on stdin, answer on stdout, until "E" or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the backup decides; EOF ends this
    inp = os.fdopen(0, "rb", buffering=1 << 20)
    out = os.fdopen(1, "wb", buffering=0)
    try:
        key = _need(inp, 32)
        (n,) = struct.unpack(">H", _need(inp, 2))
        repo_id = _need(inp, n)
        level = _need(inp, 1)[0]
        ctx, cctx = crypto.aead(key), zstandard.ZstdCompressor(level=level)
        while read_exact(inp, 1) == b"B":
            (count,) = struct.unpack(">I", _need(inp, 4))
            parts = [struct.pack(">I", count)]
            for _ in range(count):
                kind = _need(inp, _need(inp, 1)[0]).decode()
                blob_id = _need(inp, 32)
                (size,) = struct.unpack(">I", _need(inp, 4))
                sealed = seal_blob(ctx, cctx, repo_id, kind, blob_id, _need(inp, size))
                parts += [struct.pack(">I", len(sealed)), sealed]
            out.write(b"".join(parts))
    except (EOFError, OSError):
        pass
