"""A child process of lnk's own, spoken to through two pipes: the send's reading
children (``read_process.py``) and the backup's sealing process (``lnk/backup/sealer.py``)."""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import sys
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
