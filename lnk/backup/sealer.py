"""A second process that compresses and seals a backup run's small chunks.

Small chunks (a source tree's files) are named on the backup's own thread and
sealed in batches of up to 1 MiB; zstd and AES-GCM on thousands of 8 KiB
pieces cost that thread about 40% of a first backup, and threads gave nothing
back (the GIL hand-offs cost more than the second core gave).  A process does:
``SealProcess`` runs ``python -c 'from lnk.backup.sealer import serve'`` with
two pipes, sends it the run's data key once, then batches; the batches come
back sealed, in order.  The packer still decides what is stored and where.

It also reads small files for the backup (``small_reads.py``): a batch of paths
goes in, each file's stat, SHA-256, chunk ID and sealed blob come back.

Frames (big-endian), parent to child: the opening ``key(32) ‖ dedup key(32) ‖ u32
chunk size ‖ u16 n ‖ repo id(n) ‖ u8 level``; then ``"B" ‖ u32 count ‖ count x (u8 k
‖ kind(k) ‖ id(32) ‖ u32 n ‖ data(n))`` per batch of chunks, ``"R" ‖ u32 count ‖
count x (u16 n ‖ path(n))`` per batch of small files, ``"E"`` to end.  Child to
parent, in the order asked, one frame per request: ``u32 count ‖ u32 n ‖ body(n)``,
the body ``count x (u32 n ‖ sealed(n))`` for chunks, ``count x answer`` for files
(``small_reads.py``).  An answer comes whole, in one read where the pipe holds it
(both pipes are made 1 MiB where the system allows): the parent's reading thread
takes the GIL once per answer, not once per field (at each, the backup's busy
thread could hold it for the interpreter's switch interval, 5 ms).

If the process cannot start or dies (kill -9 included), every batch it had not
answered, and every later one, is sealed (or read) here instead: the run goes on
and stores the same blobs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import subprocess
import threading
from collections import deque
from concurrent.futures import Future
from typing import IO, Any

import zstandard

from lnk.backup import crypto
from lnk.backup.pack import seal_blob
from lnk.backup.small_reads import (
    SEALED_MAX,
    Sealing,
    SmallRead,
    decode,
    encode,
    read_small,
)
from lnk.formats.header import read_exact
from lnk.payload.child import need, start_child, write_all

START_AFTER = 4  # batches sealed in-process before the process starts: a small run never
# pays its start (about 0.2 s, overlapped with the run)

Batch = list[tuple[str, bytes, bytes]]  # kind, blob ID, plaintext
Sealed = list[tuple[bytes, bytes | None]]  # blob ID, sealed blob
Paths = list[bytes]  # small files to read, as the walk found them
Reads = list[SmallRead]
# a request in flight: "B" and its batch, or "R" and its paths; its answer's future
_Asked = tuple[str, Any, Future[Any]]

BODY_MAX = 64 << 20  # a longer frame is not one of ours (a batch is about 1 MiB)


def seal_batch(ctx: Any, cctx: zstandard.ZstdCompressor, repo_id: bytes, batch: Batch) -> Sealed:
    return [(i, seal_blob(ctx, cctx, repo_id, kind, i, data)) for kind, i, data in batch]


class SealProcess:
    """Batches sealed by a child process, in the order they were submitted."""

    def __init__(
        self,
        data_key: bytes,
        repo_id: bytes,
        level: int = 3,
        dedup_key: bytes = bytes(32),
        step: int = 1 << 20,
    ) -> None:
        """``dedup_key`` and ``step`` (the chunk size): for :meth:`read`."""
        self._repo_id, self._level = repo_id, level
        self._dedup_key, self._step = dedup_key, step
        self._ctx = crypto.aead(data_key)  # for batches sealed here (the child is gone)
        self._cctx: zstandard.ZstdCompressor | None = None
        self._lock = threading.Lock()
        self._here_lock = threading.Lock()
        self._send_lock = threading.Lock()  # one request written at a time, in order
        self._waiting: deque[_Asked] = deque()
        self.broken = False  # the child failed: batches are sealed here
        self._closed = False
        self._proc = start_child("lnk.backup.sealer")
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._to: IO[bytes] = self._proc.stdin
        self._from: IO[bytes] = self._proc.stdout
        self._opening = b"".join(
            [data_key, dedup_key, struct.pack(">IH", step, len(repo_id)), repo_id, bytes((level,))]
        )
        try:
            write_all(self._to, self._opening)
        except OSError:
            self.broken = True  # gone at once: everything is sealed here
        self._reader = threading.Thread(target=self._read, name="lnk-seal-recv", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def submit(self, batch: Batch) -> Future[Sealed]:
        """The batch's chunks sealed, in its order."""
        return self._ask("B", batch)

    def read(self, paths: Paths) -> Future[Reads]:
        """The small files at ``paths`` read and sealed (``small_reads.read_small``)."""
        return self._ask("R", paths)

    def _ask(self, tag: str, work: Any) -> Future[Any]:
        # written on the asking thread: a thread between would wait for the GIL while
        # the backup's thread runs (up to the switch interval, 5 ms, per request)
        fut: Future[Any] = Future()
        with self._send_lock:
            with self._lock:
                asked = not self.broken
                if asked:
                    self._waiting.append((tag, work, fut))
            if asked:
                # answered by the child, or else by whoever finds it gone (``_fail`` takes
                # every request still waiting, ours included, at the moment it is broken)
                if not self.broken:
                    try:
                        write_all(self._to, _frame(tag, work))
                    except (OSError, ValueError):
                        self._fail()
                return fut
        fut.set_result(self._here(tag, work))
        return fut

    def close(self) -> None:
        """End the child (it has answered everything asked by now, or is gone)."""
        with self._send_lock:
            self._closed = True
            with contextlib.suppress(OSError, ValueError):
                self._to.write(b"E")
            with contextlib.suppress(OSError):
                self._to.close()
        self._reader.join()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    # ---- the answers --------------------------------------------------------------

    def _read(self) -> None:
        try:
            while True:
                head = read_exact(self._from, 8)
                if not head:
                    break
                count, size = struct.unpack(">II", head)
                with self._lock:
                    tag, work, fut = self._waiting[0]
                if count != len(work) or size > BODY_MAX:
                    raise EOFError  # not its answer: done here, with the rest
                answer = _answer(tag, work, need(self._from, size))
                with self._lock:
                    self._waiting.popleft()
                fut.set_result(answer)
        except (OSError, EOFError, ValueError, struct.error, IndexError):
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
        for tag, work, fut in left:
            if not fut.done():
                try:
                    fut.set_result(self._here(tag, work))
                except BaseException as e:  # handed to whoever waits
                    fut.set_exception(e)

    def _here(self, tag: str, work: Any) -> Any:
        # the reader thread (a child's batches left unanswered) and the caller's (batches
        # submitted after) may both seal here; a zstd compressor takes one at a time
        with self._here_lock:
            if self._cctx is None:
                self._cctx = zstandard.ZstdCompressor(level=self._level)
            if tag == "R":
                s = Sealing(self._ctx, self._cctx, self._repo_id, self._dedup_key, self._step)
                return [read_small(p, s) for p in work]
            return seal_batch(self._ctx, self._cctx, self._repo_id, work)


def _frame(tag: str, work: Any) -> bytes:
    """A request's frame (see the module's docstring)."""
    parts = [tag.encode(), struct.pack(">I", len(work))]
    if tag == "R":
        for path in work:
            parts += [struct.pack(">H", len(path)), path]
    else:
        for kind, blob_id, data in work:
            k = kind.encode()
            parts += [bytes((len(k),)), k, blob_id, struct.pack(">I", len(data)), data]
    return b"".join(parts)


def _answer(tag: str, work: Any, body: bytes) -> Any:
    """A frame's body as the answer to ``work``; ValueError if it is not one."""
    at = 0
    if tag == "R":
        reads: Reads = []
        for _ in work:
            r, at = decode(body, at)
            reads.append(r)
        answer: Any = reads
    else:
        sealed: Sealed = []
        for _k, blob_id, _d in work:
            (n,) = struct.unpack_from(">I", body, at)
            at += 4
            if n > SEALED_MAX or at + n > len(body):
                raise ValueError("not an answer")
            sealed.append((blob_id, body[at : at + n]))
            at += n
        answer = sealed
    if at != len(body):
        raise ValueError("not an answer")
    return answer


def serve() -> None:
    """The child: seal each batch read on stdin, answer on stdout, until "E" or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the backup decides; EOF ends this
    inp = os.fdopen(0, "rb", buffering=1 << 20)
    out = os.fdopen(1, "wb", buffering=0)
    try:
        key, dedup_key = need(inp, 32), need(inp, 32)
        step, n = struct.unpack(">IH", need(inp, 6))
        repo_id = need(inp, n)
        level = need(inp, 1)[0]
        ctx, cctx = crypto.aead(key), zstandard.ZstdCompressor(level=level)
        sealing = Sealing(ctx, cctx, repo_id, dedup_key, step)
        while (tag := read_exact(inp, 1)) in (b"B", b"R"):
            (count,) = struct.unpack(">I", need(inp, 4))
            parts = [b""]
            for _ in range(count):
                if tag == b"R":
                    (size,) = struct.unpack(">H", need(inp, 2))
                    parts.append(encode(read_small(need(inp, size), sealing)))
                    continue
                kind = need(inp, need(inp, 1)[0]).decode()
                blob_id = need(inp, 32)
                (size,) = struct.unpack(">I", need(inp, 4))
                sealed = seal_blob(ctx, cctx, repo_id, kind, blob_id, need(inp, size))
                parts += [struct.pack(">I", len(sealed)), sealed]
            parts[0] = struct.pack(">II", count, sum(map(len, parts)))
            out.write(b"".join(parts))
    except (EOFError, OSError):
        pass
