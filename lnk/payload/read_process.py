"""A send's small files read and hashed by child processes, not by its own threads.

A first send of a source tree is a hundred thousand small files.  Read by threads,
each file is five system calls (open, read, fstat, close, and the hash of more than
2 KiB), and at each the thread lets go of the interpreter's lock and waits to take
it back from the walk and the other threads: at 100,000 files, two million
``futex`` calls, and a walk whose every ``lstat`` waited behind them.  Here each
reading thread of the send (``reading.Readers``) hands its job, the paths of a few
dozen small files as the walk found them, to a child process of its own and waits
for one answer: the files' bytes, SHA-256 and stat.  The reading rule is the same
as the threads' first try (:func:`read_once`): the file opened by its path, at most
its walked size and one byte read, then its ``fstat``, which must show the very
file the walk found (device, inode), a regular file, unchanged since the walk, all
its bytes read.  Anything else is answered ``OTHER``, and the thread reads that
file itself the long way, as it always did (so a file that changes, a link on its
way, a fifo swapped in: the thread's rules decide, as before).

The child is started by ``python -S -c`` (it imports this module, ``pinned`` and
the standard library: about 0.05 s), ends on ``E`` or at the end of its input (its
send killed), and ignores SIGINT (the send decides).  If it cannot start, dies or
answers what is not an answer, the thread reads that job and every later one itself.

Frames (big-endian).  Parent to child, per job: ``"R" ‖ u32 count ‖ count x (u64 dev
‖ u64 ino ‖ i64 size ‖ i64 mtime_ns ‖ i64 ctime_ns ‖ u16 n ‖ path(n))``; ``"E"`` to
end.  Child to parent, per job, in order: ``u32 count ‖ u32 n ‖ body(n)``, the body
``count x answer``, an answer ``u8 status`` and for ``READ``: ``sha256(32) ‖ i64 t0
‖ stat: i64 mode ‖ u64 ino ‖ u64 dev ‖ 7 x i64 (nlink, uid, gid, size, atime,
mtime, ctime; times in ns) ‖ u32 n ‖ data(n)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import signal
import stat
import struct
import subprocess
import time
from pathlib import Path
from typing import IO, cast

from lnk.payload.child import STAT, need, start_child, stat_fields, stat_of, write_all
from lnk.payload.pinned import ident, open_file, same_stat

READ, OTHER = 0, 1
SMALL_MAX = 1 << 20  # the largest file a job names: the send's small file (SMALL_FILE)
JOB_MAX = 4096  # files a job may name

_ASK = struct.Struct(">QQqqqH")
_HEAD = struct.Struct(f">32sq{STAT}I")

Answer = tuple[memoryview, str, os.stat_result, int]  # data, SHA-256 (hex), stat after, t0
Job = list[tuple[bytes, os.stat_result]]  # each file's path and the walk's lstat of it


def read_once(
    path: str | bytes | Path, st: os.stat_result
) -> tuple[bytes, os.stat_result, int] | None:
    """A small file read in one go as the walk found it (``st``: its lstat): its bytes,
    its ``fstat`` after the read, and when the read began (time_ns); None unless that
    stat shows the very file the walk found, a regular file, and every byte of its
    walked size was read.  Whether it is unchanged since the walk (``same_stat``) is the
    caller's to check.  Never reads more than the walked size and one byte, whatever
    was opened."""
    t0 = time.time_ns()
    try:
        fd = open_file(path)
    except OSError:
        return None
    try:
        data = os.read(fd, st.st_size + 1)
        after = os.fstat(fd)
    except OSError:  # a folder or a fifo swapped in: the long way says what it is
        return None
    finally:
        os.close(fd)
    if ident(after) != ident(st) or not stat.S_ISREG(after.st_mode) or len(data) != st.st_size:
        return None
    return data, after, t0


class ReadProcess:
    """One child reading jobs, asked and answered one at a time by one thread."""

    def __init__(self) -> None:
        self._proc = start_child("lnk.payload.read_process", site=False)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._to: IO[bytes] = self._proc.stdin
        self._from = cast(io.FileIO, self._proc.stdout)  # (bufsize=0: unbuffered)
        self.broken = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def read(self, job: Job) -> list[Answer | None] | None:
        """Each file of ``job`` as the child read it (None: read it the long way), or None
        for the whole job if the child is gone or did not answer as it should (then it
        is ended, and every later job is None at once)."""
        if self.broken or not job or len(job) > JOB_MAX:
            return None
        try:
            parts = [b"R", struct.pack(">I", len(job))]
            for path, st in job:
                ask = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                parts += [_ASK.pack(*ask, len(path)), path]
            write_all(self._to, b"".join(parts))
            count, size = struct.unpack(">II", need(self._from, 8))
            if count != len(job) or size > len(job) * (SMALL_MAX + 256):
                raise ValueError("not an answer")
            body = bytearray(size)  # the files' bytes are views into it: no copy each
            view = memoryview(body)
            got = 0
            while got < size:
                n = self._from.readinto(view[got:])
                if not n:
                    raise EOFError
                got += n
            return _decode(view, job)
        except (OSError, EOFError, ValueError, IndexError, struct.error):
            self.close(kill=True)
            return None

    def close(self, kill: bool = False) -> None:
        self.broken = True
        if kill:
            with contextlib.suppress(OSError):
                self._proc.kill()
        with contextlib.suppress(OSError, ValueError):
            self._to.write(b"E")
        for pipe in (self._to, self._from):
            with contextlib.suppress(OSError):
                pipe.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _decode(body: memoryview, job: Job) -> list[Answer | None]:
    """The answers in ``body`` to ``job``; ValueError if they are not answers to it."""
    out: list[Answer | None] = []
    at = 0
    for _path, walked in job:
        status = body[at]
        if status == OTHER:
            out.append(None)
            at += 1
            continue
        if status != READ:
            raise ValueError("not an answer")
        sha, t0, *fields, n = _HEAD.unpack_from(body, at + 1)
        at += 1 + _HEAD.size
        st = stat_of(fields)
        # only what was asked: the walked file, whole (the child's word is checked)
        whole = n == st.st_size == walked.st_size
        if ident(st) != ident(walked) or not whole or at + n > len(body):
            raise ValueError("not an answer")
        out.append((body[at : at + n], sha.hex(), st, t0))
        at += n
    if at != len(body):
        raise ValueError("not an answer")
    return out


def _encode(path: bytes, walked: os.stat_result) -> list[bytes]:
    got = read_once(path, walked)
    if got is None or not same_stat(walked, got[1]):
        return [bytes((OTHER,))]
    data, st, t0 = got
    sha = hashlib.sha256(data).digest()
    return [b"\0" + _HEAD.pack(sha, t0, *stat_fields(st), len(data)), data]


def serve() -> None:
    """The child: answer each job read on stdin, on stdout, until "E" or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the send decides; EOF ends this
    inp = os.fdopen(0, "rb", buffering=1 << 20)
    out = os.fdopen(1, "wb", buffering=0)
    try:
        while need(inp, 1) == b"R":
            (count,) = struct.unpack(">I", need(inp, 4))
            if count > JOB_MAX:
                return
            parts: list[bytes] = [b""]
            for _ in range(count):
                dev, ino, size, m_ns, c_ns, n = _ASK.unpack(need(inp, _ASK.size))
                path = need(inp, n)
                if size > SMALL_MAX:
                    parts.append(bytes((OTHER,)))
                    continue
                walked = stat_of((stat.S_IFREG, ino, dev, 0, 0, 0, size, 0, m_ns, c_ns))
                parts += _encode(path, walked)
            parts[0] = struct.pack(">II", count, sum(map(len, parts)))
            _write_parts(out.fileno(), parts)
    except (EOFError, OSError):
        pass


def _write_parts(fd: int, parts: list[bytes]) -> None:
    """``parts`` written in order, a few hundred a system call, none joined (a copy)."""
    views = [memoryview(p) for p in parts if p]
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i : i + 512])
        while n and n >= len(views[i]):
            n -= len(views[i])
            i += 1
        if n:
            views[i] = views[i][n:]
