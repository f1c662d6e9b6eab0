"""A child process of lnk's own, spoken to through two pipes: the send's reading
children (``read_process.py``) and the backup's sealing process (``lnk/backup/sealer.py``),
and what both frame formats share: exact reads, and a file's stat."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

PIPE_SIZE = 1 << 20  # F_SETPIPE_SZ where the system allows (Linux's unprivileged most)

_ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the folder holding lnk/


def start_child(module: str, *, site: bool = True) -> subprocess.Popen[bytes]:
    """``MODULE.serve()`` in a new Python, this lnk first on its path; its stdin and
    stdout pipes unbuffered (each 1 MiB where the system allows), its stderr thrown
    away.  ``site=False``: without the site packages (``-S``: a child that needs
    nothing of them starts sooner).  Raises OSError if it cannot start."""
    code = f"import sys; sys.path.insert(0, {_ROOT!r}); from {module} import serve; serve()"
    proc = subprocess.Popen(
        [sys.executable, *(() if site else ("-S",)), "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        bufsize=0,
    )
    assert proc.stdin is not None and proc.stdout is not None
    for pipe in (proc.stdin, proc.stdout):
        with contextlib.suppress(OSError, AttributeError):  # (no F_SETPIPE_SZ: macOS)
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    return proc


def write_all(f: IO[bytes], data: bytes) -> None:
    """All of ``data`` written to the unbuffered ``f``."""
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]


def need(f: IO[bytes], n: int) -> bytes:
    """Exactly ``n`` bytes from ``f``, or EOFError."""
    chunks, left = [], n
    while left:
        got = f.read(left)
        if not got:
            raise EOFError
        chunks.append(got)
        left -= len(got)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


STAT = "qQQqqqqqqq"
"""A file's stat in a frame (``struct``, big-endian): mode, ino and dev (unsigned, as the
kernel has them), nlink, uid, gid, size, then atime, mtime and ctime in ns."""


def stat_fields(st: os.stat_result) -> tuple[int, ...]:
    """``st`` as :data:`STAT`'s ten fields."""
    return (
        st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, st.st_size,
        st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns,
    )  # fmt: skip


def stat_of(fields: Sequence[int]) -> os.stat_result:
    """A stat from :data:`STAT`'s ten fields."""
    ns = fields[7:10]
    return os.stat_result((*fields[:7], *(t // 10**9 for t in ns), *(t / 1e9 for t in ns), *ns))
