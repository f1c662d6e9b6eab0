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
import time
from concurrent.futures import Future
from pathlib import Path

from lnk.payload.pinned import SQLITE_MAGIC, ident, open_file, open_walked
from lnk.payload.snapshots import sqlite_snapshot

SETTLE_TRIES = 4  # reads of a file that changes while read, before it counts as unsettled
READ_CHUNK = 1 << 20


class Read:
    """What reading one file found: its bytes (small files), SHA-256, stat, and whether
    it held still while it was read."""

    __slots__ = ("data", "head", "settled", "sha", "snapshot", "st", "t0")

    def __init__(
        self, data: bytes | None, sha: str, st: os.stat_result, settled: bool, head: bytes = b""
    ) -> None:
        self.data, self.sha, self.st, self.settled, self.head = data, sha, st, settled, head
        self.snapshot: Path | None = None  # a SQLite database's snapshot, read instead
        self.t0 = 0  # when the read began (time_ns)


def same_stat(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_ino, a.st_size, a.st_mtime_ns, a.st_ctime_ns) == (
        b.st_ino,
        b.st_size,
        b.st_mtime_ns,
        b.st_ctime_ns,
    )


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
                data: bytes | None = whole
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
    """A small file read in one go, the walk's lstat ``st`` standing for the stat before
    the read: opened by its path, at most its walked size and one byte read, then its
    ``fstat``.  Taken only if that shows the very file the walk found (device, inode),
    a regular file, unchanged since the walk (so unchanged while read), and all its
    bytes read; else None, and the file is read the long way (a stat before and after,
    reached through folders only).  One system call, and one hand-off of the GIL to the
    other threads, fewer a file: a send reads 100,000 small files."""
    t0 = time.time_ns()
    try:
        fd = open_file(path)
    except OSError:
        return None
    try:
        data = os.read(fd, st.st_size + 1)  # never more, whatever was opened
        after = os.fstat(fd)
    except OSError:  # a folder or a fifo swapped in: the long way says what it is
        return None
    finally:
        os.close(fd)
    if (
        ident(after) != ident(st)
        or not stat.S_ISREG(after.st_mode)
        or not same_stat(st, after)
        or len(data) != st.st_size
    ):
        return None
    got = Read(data, hashlib.sha256(data).hexdigest(), after, True, data[:16])
    got.t0 = t0
    return got


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
    """Read a few files (one job for many: a pool's cost per job is paid once).

    A SQLite database (told by its first bytes) is read as a snapshot taken
    through SQLite's online backup API, never as its live bytes."""
    for slot in slots:
        got = read_settled(slot.path, slot.keep, rel=slot.rel, st=slot.st)
        if got is not None and got.head == SQLITE_MAGIC:
            snap = sqlite_snapshot(slot.path, snap_dir, slot.rel, got.st)
            if snap is not None:  # else not one SQLite can read: its bytes as they are
                got = read_settled(snap, slot.keep)
                if got is not None:
                    got.snapshot = snap
        slot.got = got
