"""Reading an agent's files for a send: each file read (small ones into memory) and
hashed, and read again while it changes under us, by jobs of many files at a time.

A file is checked before and after each read (inode, size, mtime, ctime); one that
never holds still comes back with ``settled=False``.  A SQLite database, told by
its first bytes, is read as a snapshot taken through SQLite's backup API.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from lnk.payload.pinned import SQLITE_MAGIC, open_file, open_walked, same_stat
from lnk.payload.read_process import ReadProcess, read_once
from lnk.payload.snapshots import sqlite_snapshot

SETTLE_TRIES = 4  # reads of a file that changes while read, before it counts as unsettled
READ_CHUNK = 1 << 20


class Read:
    """What reading one file found: its bytes (small files), SHA-256, stat, and whether
    it held still while it was read."""

    __slots__ = ("data", "head", "settled", "sha", "snapshot", "st", "t0")

    def __init__(
        self,
        data: bytes | memoryview | None,
        sha: str,
        st: os.stat_result,
        settled: bool,
        head: bytes = b"",
    ) -> None:
        self.data, self.sha, self.st, self.settled, self.head = data, sha, st, settled, head
        self.snapshot: Path | None = None  # a SQLite database's snapshot, read instead
        self.t0 = 0  # when the read began (time_ns)


def read_settled(
    path: Path | str,
    keep: bool,
    tries: int = SETTLE_TRIES,
    rel: str = "",
    st: os.stat_result | None = None,
) -> Read | None:
    """Read (``keep``: into memory) and hash a file, again while it changes under us.

    ``rel`` and ``st``: the file a walk found there (its path in the agent, its lstat),
    read as ``pinned.open_walked`` opens it (never through a link on the way); without
    them, a file of lnk's own (a private snapshot).  None if it is gone, or is no longer
    a regular file (never followed if a link).  The last read is returned with
    ``settled=False`` if the file changed every time.
    """
    if keep and rel and st is not None:
        quick = _read_as_walked(path, st)
        if quick is not None:
            return quick
    last: Read | None = None
    for attempt in range(tries):
        if attempt:
            time.sleep(0.002 * attempt)
        t0 = time.time_ns()
        try:
            if rel:
                fd, before = open_walked(path, rel, st)
            else:
                fd = open_file(path)
                before = os.fstat(fd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(before.st_mode):
                return None
            h = hashlib.sha256()
            size = 0
            head = b""
            if keep:
                chunks = []
                while True:
                    want = max(before.st_size - size, 0) + 65536
                    chunk = os.read(fd, want)
                    chunks.append(chunk)
                    h.update(chunk)
                    size += len(chunk)
                    # a short read with all its stat said: the end (no read of nothing
                    # to learn it: a system call, and a hand-off of the GIL, a file)
                    if not chunk or (len(chunk) < want and size >= before.st_size):
                        break
                whole = b"".join(chunks)
                head = whole[:16]
                data: bytes | memoryview | None = whole
            else:
                data = None
                buf = bytearray(READ_CHUNK)
                view = memoryview(buf)
                with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                    while n := f.readinto(buf):
                        if not size:
                            head = bytes(view[:16])
                        h.update(view[:n])
                        size += n
            after = os.fstat(fd)
        finally:
            os.close(fd)
        last = Read(
            data, h.hexdigest(), after, same_stat(before, after) and size == after.st_size, head
        )
        last.t0 = t0
        if last.settled:
            return last
    return last


def _read_as_walked(path: Path | str, st: os.stat_result) -> Read | None:
    """A small file read in one go (``read_process.read_once``), the walk's lstat ``st``
    standing for the stat before the read; taken only if unchanged since the walk (so
    unchanged while read), else None, and the file is read the long way (a stat before
    and after, reached through folders only).  One system call, and one hand-off of the
    GIL to the other threads, fewer a file: a send reads 100,000 small files."""
    got = read_once(path, st)
    if got is None or not same_stat(st, got[1]):
        return None
    data, after, t0 = got
    return _whole(data, hashlib.sha256(data).hexdigest(), after, t0)


def _whole(data: bytes | memoryview, sha: str, st: os.stat_result, t0: int) -> Read:
    """A file read whole in one go, unchanged while read (begun at ``t0``)."""
    read = Read(data, sha, st, True, bytes(data[:16]))
    read.t0 = t0
    return read


class Slot:
    """One file's read, done by a job that reads a chunk of files."""

    __slots__ = ("done", "got", "keep", "path", "rel", "st")

    def __init__(
        self, path: Path | str, keep: bool, rel: str = "", st: os.stat_result | None = None
    ) -> None:
        """``rel``, ``st``: as :func:`read_settled`'s."""
        self.path, self.keep, self.rel, self.st = path, keep, rel, st
        self.got: Read | None = None
        self.done: Future[None] | None = None

    def result(self) -> Read | None:
        assert self.done is not None
        self.done.result()
        return self.got


def read_chunk(slots: list[Slot], snap_dir: Path) -> None:
    """Read a few files (one job for many: a pool's cost per job is paid once), those a
    child process did not answer already (``Readers``).

    A SQLite database (told by its first bytes) is read as a snapshot taken
    through SQLite's online backup API, never as its live bytes."""
    for slot in slots:
        got = slot.got or read_settled(slot.path, slot.keep, rel=slot.rel, st=slot.st)
        if got is not None and got.head == SQLITE_MAGIC:
            snap = sqlite_snapshot(slot.path, snap_dir, slot.rel, got.st)
            if snap is not None:  # else not one SQLite can read: its bytes as they are
                got = read_settled(snap, slot.keep)
                if got is not None:
                    got.snapshot = snap
        slot.got = got


class Readers:
    """A send's reading pool: ``workers`` threads, each handing its jobs' small files to a
    child process of its own (``read_process.py``) once ``START_AFTER`` jobs went by
    (a send of a few files never pays the start), and reading the rest itself."""

    START_AFTER = 8

    def __init__(self, workers: int, snap_dir: Path) -> None:
        self.snap_dir = snap_dir
        self._pool = ThreadPoolExecutor(workers, "lnk-read")
        self._mine = threading.local()
        self._procs: list[ReadProcess] = []
        self._lock = threading.Lock()
        self._jobs = 0
        self._closed = False

    def submit(self, slots: list[Slot]) -> Future[None]:
        """``slots`` read (each ``Slot.got`` set) by the pool; the future says when."""
        self._jobs += 1
        return self._pool.submit(self._job, slots, self._jobs > self.START_AFTER)

    def _job(self, slots: list[Slot], child: bool) -> None:
        # (a job of big files only, read as they go, starts no child)
        asked = [s for s in slots if s.keep and s.rel and s.st is not None] if child else []
        proc = self._proc() if asked else None
        if proc is not None:
            job = [(os.fsencode(s.path), s.st) for s in asked if s.st is not None]
            answers = proc.read(job)
            for slot, answer in zip(asked, answers or [None] * len(asked), strict=True):
                if answer is not None:
                    slot.got = _whole(*answer)
        read_chunk(slots, self.snap_dir)

    def _proc(self) -> ReadProcess | None:
        proc: ReadProcess | None = getattr(self._mine, "proc", None)
        if proc is None and not getattr(self._mine, "failed", False):
            with self._lock:
                if self._closed:
                    return None
                try:
                    proc = ReadProcess()
                except OSError:  # no process to start: this thread reads, as before
                    self._mine.failed = True
                    return None
                self._procs.append(proc)
            self._mine.proc = proc
        return proc

    def shutdown(self) -> None:
        """Jobs not started are dropped, those running finish; then every child ends."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._closed = True
            procs, self._procs = self._procs, []
        for proc in procs:
            proc.close()
