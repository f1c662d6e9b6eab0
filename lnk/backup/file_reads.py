"""An agent's files into a backup, one at a time and in walk order.

A file whose stat is the one the last backup to this repository read (the chunk
cache) is stored by its known chunks and never opened.  Any other file is opened
without following a link (one swapped for a link after the walk is left out): a small
one is read whole in one call, a big one a chunk at a time.  (Reading small files
ahead on reader threads was measured slower: 20-24 s against 11.8 s for 100,000
files, the main thread losing the GIL to them at every system call.)  A SQLite
database, told by its first 16 bytes, is stored as a snapshot taken through SQLite's
backup API.  A file changed less than two seconds before its read is not remembered
(a change within the clock's step would not show in its stat).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Any

from lnk.backup.filecache import ChunkCache
from lnk.backup.small_reads import GONE as GONE_READ
from lnk.backup.small_reads import READ, SmallRead
from lnk.payload.hashcache import RACY_NS, HashCache
from lnk.payload.manifest import EMPTY_SHA, file_mode
from lnk.payload.pinned import GONE, ident, open_file, open_walked
from lnk.payload.snapshots import sqlite_snapshot
from lnk.payload.walk import SQLITE_MAGIC, WalkedFile


# never through a link; a fifo swapped in after the walk does not block the open
def read(fd: int, n: int) -> bytes:
    """Every byte of file content a backup reads goes through here."""
    return os.read(fd, n)


class Stream:
    """A file read from ``fd`` after ``first`` (already read), hashed and counted."""

    def __init__(self, fd: int, first: bytes) -> None:
        self.fd, self.first = fd, first
        self.h = hashlib.sha256(first)
        self.n = len(first)

    def read(self, n: int = -1) -> bytes:
        if self.first:
            data, self.first = self.first, b""
            return data
        data = read(self.fd, n if n > 0 else 1 << 20)
        self.h.update(data)
        self.n += len(data)
        return data


class FileSaver:
    """Stores each file of one backup (see the module's docstring)."""

    def __init__(self, w: Any, cache: HashCache, chunks: ChunkCache, snap_dir: str) -> None:
        self.w, self.cache, self.chunks, self.snap_dir = w, cache, chunks, snap_dir
        self.step: int = w.repo.chunk_size
        self.groups: dict[int, tuple[str, int]] = {}  # group -> sha, size as read
        self.vouched = False  # the last file stored: the hash cache vouches for it now
        # what the chunk cache said of a file :meth:`readable` kept here (it is stored,
        # in walk order, by its known chunks: not looked up twice); at most the files
        # the read-ahead holds
        self._hits: dict[str, tuple[str, list[str]]] = {}

    def _hit(self, rel: str, st: os.stat_result) -> tuple[str, list[str]] | None:
        hit = self.chunks.file(rel, st) if stat.S_ISREG(st.st_mode) else None
        if hit is not None and len(hit[1]) == -(-st.st_size // self.step):
            return hit
        return None

    def file(self, f: WalkedFile) -> tuple[str, int, bytes, bytes] | None:
        """(SHA-256, size, tree line, blob IDs) of one file as stored; None if it went."""
        self.vouched = False  # a hard link or a database: no folder digest
        if f.group is not None and not f.group_first and f.group in self.groups:
            sha, size = self.groups[f.group]
            return sha, size, b"", b""
        if f.size == 0 and f.group is None:
            self.vouched = True
            return EMPTY_SHA, 0, b"", b""
        assert f.source is not None
        got = self._store(f, f"agent/{f.rel}", file_mode(f.mode))
        if got is None:
            return None
        sha, size, ids = got
        if size == 0:
            sha = EMPTY_SHA
        if f.group is not None:
            self.groups[f.group] = (sha, size)
        return sha, size, (self.w.last_line if size else b""), ids

    def readable(self, f: WalkedFile) -> bytes | None:
        """Where the second process may read ``f`` for this run (``small_reads.py``): a
        small regular file, not a hard link, whose chunks the cache does not know; else
        None (:meth:`file` reads it here)."""
        st = f.st
        if f.kind != "f" or f.group is not None or f.snapshot or st is None or f.source is None:
            return None
        if not 0 < f.size < self.step:
            return None
        hit = self._hit(f.rel, st)
        if hit is not None:
            self._hits[f.rel] = hit  # for :meth:`_store`, with the same stat
            return None
        path = os.fsencode(f.source)
        return path if len(path) <= 0xFFFF else None

    def taken(self, f: WalkedFile, r: SmallRead) -> tuple[str, int, bytes, bytes] | None:
        """:meth:`file` for one the second process read: ``r``, its answer."""
        self.vouched = False
        if r.status != READ:
            return None if r.status == GONE_READ else self.file(f)  # OTHER: read here
        st = r.st
        assert st is not None
        if f.st is not None and ident(st) != ident(f.st):
            # not the file the walk found (replaced, or a folder on its way swapped for
            # a link): what was read there is dropped, and the file read here, checked
            return self.file(f)
        size = st.st_size
        chunks = self.w.add_sealed(f"agent/{f.rel}", file_mode(f.mode), size, r.blob_id, r.sealed)
        sha, n, ids = self._remember(f, st, r.t0, r.sha.hex(), size, chunks)
        return sha, n, (self.w.last_line if n else b""), ids

    def _store(self, f: WalkedFile, path: str, mode: int) -> tuple[str, int, bytes] | None:
        w = self.w
        st = f.st
        try:
            if st is None:
                st = os.lstat(f.source)  # type: ignore[arg-type]
        except FileNotFoundError:
            return None
        hit = self._hits.pop(f.rel, None) or self._hit(f.rel, st)  # never a database's
        if hit is not None and w.add_known(path, mode, st.st_size, hit[1]):
            # unchanged since a read the stat still vouches for: not even opened
            self.vouched = st.st_mtime_ns == f.mtime_ns and st.st_size == f.size
            return hit[0], st.st_size, b"".join(bytes.fromhex(c) for c in hit[1])
        try:
            assert f.source is not None
            if f.snapshot:
                fd = open_file(f.source)
                st = os.fstat(fd)
            else:  # the file the walk found, never through a link on its way (pinned.py)
                fd, st = open_walked(f.source, f.rel, f.st)
        except OSError as e:
            if e.errno in GONE:  # gone, or now a link (or one on its way)
                return None
            raise
        try:
            if not stat.S_ISREG(st.st_mode):
                return None
            t0 = time.time_ns()
            small = st.st_size < self.step
            first = read(fd, st.st_size + 1 if small else self.step)
            if first[:16] == SQLITE_MAGIC:
                stored = self._store_sqlite(f, path, mode, st)
                if stored is not None:
                    return stored  # else not one SQLite can read: its bytes as they are
            if small and len(first) <= st.st_size:  # all of it, in one read
                sha = hashlib.sha256(first).hexdigest()
                n = len(first)
                chunks = w.add_bytes(path, mode, first)
            else:
                src = Stream(fd, first)
                chunks = w.add_file(path, mode, src)
                sha, n = src.h.hexdigest(), src.n
        finally:
            os.close(fd)
        return self._remember(f, st, t0, sha, n, chunks)

    def _remember(
        self,
        f: WalkedFile,
        st: os.stat_result,
        t0: int,
        sha: str,
        n: int,
        chunks: list[str],
    ) -> tuple[str, int, bytes]:
        """Cache what was read by the stat ``st`` it had as the read began at ``t0``,
        unless it was changed less than two seconds before: then a change during or
        after the read would leave the same stat (the clock moves in steps).  Otherwise
        any later write moves its mtime past ``t0``, so this stat never vouches for other
        bytes, and no second stat is needed."""
        if n == st.st_size and st.st_mtime_ns < t0 - RACY_NS:
            self.chunks.store_file(f.rel, st, sha, chunks)
            self.cache.store(f.rel, st, sha)
            self.vouched = n == f.size and st.st_mtime_ns == f.mtime_ns  # as the walk saw it
        return sha, n, b"".join(bytes.fromhex(c) for c in chunks)

    def _store_sqlite(
        self, f: WalkedFile, path: str, mode: int, st: os.stat_result
    ) -> tuple[str, int, bytes] | None:
        """A live database: a consistent copy through SQLite's backup API is stored."""
        assert f.source is not None
        snap = sqlite_snapshot(f.source, Path(self.snap_dir), f.rel, st)
        if snap is None:
            return None
        try:
            fd = open_file(snap)
            try:
                src = Stream(fd, b"")
                chunks = self.w.add_file(path, mode, src)
            finally:
                os.close(fd)
        finally:
            snap.unlink(missing_ok=True)
        return src.h.hexdigest(), src.n, b"".join(bytes.fromhex(c) for c in chunks)
