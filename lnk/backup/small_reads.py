"""Small files read, hashed, named and sealed by the sealing process, ahead of the
backup's own thread.

A first backup of a source tree is a hundred thousand small files.  Its own thread
walked, opened, read and hashed each, named its chunk (HMAC-SHA256) and wrote the
lines, while the second process (``sealer.py``) only compressed and sealed: 12.9 s
of CPU against 6.7 s, so one core waited on the other.  Here the second process
does the reading too: it is sent the paths of a batch of small files the walk
found, and answers, per file, its stat, SHA-256, chunk ID and sealed blob; the
backup's thread writes the entries in walk order as the answers come (``ReadAhead``
in ``read_ahead.py``).

The reading is the backup's own rules, done there: opened without following a link
and without blocking (``open_file``), a regular file by its ``fstat``, read whole in
one call.  Anything else is answered ``OTHER`` and the backup's thread reads that
file itself, as it always did (a file grown past the one read or past a chunk, a
SQLite database, an error: its error is raised there, as before); a file gone or no
longer regular is answered ``GONE``.

Answer (big-endian): ``u8 status``; for ``READ``: ``sha256(32) ‖ id(32) ‖ i64
t0 ‖ stat: i64 mode ‖ u64 ino ‖ u64 dev ‖ 7 x i64 (nlink, uid, gid, size,
atime, mtime, ctime; times in ns) ‖ u32 n ‖ sealed(n)`` (n = 0 for an empty file: no chunk).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import struct
import time
from typing import Any, NamedTuple

import zstandard

from lnk.backup.pack import blob_name, seal_blob
from lnk.backup.repository import SIZES
from lnk.payload.child import STAT, stat_fields, stat_of
from lnk.payload.pinned import open_file
from lnk.payload.walk import SQLITE_MAGIC

READ, GONE, OTHER = 0, 1, 2
# a sealed chunk is at most the largest chunk a config may name and some bytes: a longer
# one in an answer is not one of ours
SEALED_MAX = SIZES["chunk_size"][1] + (64 << 10)
_HEAD = struct.Struct(f">32s32sq{STAT}I")


class SmallRead(NamedTuple):
    """One small file as the sealing process read it."""

    status: int
    sha: bytes = b""
    blob_id: bytes = b""  # b"" for an empty file (no chunk)
    sealed: bytes = b""
    st: os.stat_result | None = None
    t0: int = 0  # when the read began (time_ns): the hash cache's racy rule


class Sealing(NamedTuple):
    """What reading a small file into a sealed blob needs."""

    ctx: Any  # the run's AES-GCM
    cctx: zstandard.ZstdCompressor
    repo_id: bytes
    dedup_key: bytes
    step: int  # the repository's chunk size: a file this big or bigger is not small


def read_small(path: bytes, s: Sealing) -> SmallRead:
    """Read one small file at ``path`` into its sealed blob (see the module's docstring)."""
    try:
        fd = open_file(path)
    except OSError as e:
        return SmallRead(GONE if e.errno in (errno.ENOENT, errno.ELOOP) else OTHER)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return SmallRead(GONE)
        if st.st_size >= s.step:
            return SmallRead(OTHER)
        t0 = time.time_ns()
        data = os.read(fd, st.st_size + 1)
    except OSError:
        return SmallRead(OTHER)
    finally:
        os.close(fd)
    if len(data) != st.st_size or data[:16] == SQLITE_MAGIC:
        return SmallRead(OTHER)  # changed as it was read, or a database
    sha = hashlib.sha256(data).digest()
    if not data:
        return SmallRead(READ, sha, b"", b"", st, t0)
    blob_id = blob_name(s.dedup_key, "data", data)
    sealed = seal_blob(s.ctx, s.cctx, s.repo_id, "data", blob_id, data)
    return SmallRead(READ, sha, blob_id, sealed, st, t0)


def encode(r: SmallRead) -> bytes:
    if r.status != READ:
        return bytes((r.status,))
    st = r.st
    assert st is not None
    head = _HEAD.pack(r.sha, r.blob_id.ljust(32, b"\0"), r.t0, *stat_fields(st), len(r.sealed))
    return b"\0" + head + r.sealed


def decode(buf: bytes, at: int) -> tuple[SmallRead, int]:
    """One answer read from ``buf`` at offset ``at``, and the offset after it; ValueError
    if it is cut short or is not one of ours."""
    status = buf[at]
    if status in (GONE, OTHER):
        return SmallRead(status), at + 1
    if status != READ:
        raise ValueError("not an answer")
    sha, blob_id, t0, *fields, n = _HEAD.unpack_from(buf, at + 1)
    at += 1 + _HEAD.size
    if n > SEALED_MAX or at + n > len(buf):
        raise ValueError("not an answer")
    sealed = buf[at : at + n]
    st = stat_of(fields)
    return SmallRead(READ, sha, blob_id if n else b"", sealed, st, t0), at + n
