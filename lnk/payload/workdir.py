"""A send's or a backup's private folder (its databases' snapshots, its spool), in the
agent's runtime folder: beside the agent's files as a rule, so a database is
snapshotted through a hard link to the very file walked (``snapshots.py``).

A run killed outright leaves its folder behind, and a runtime folder is not emptied
by the system as ``/tmp`` is: each run holds a lock on its own folder, and the next
removes the folders of its kind that no process holds (and that were left a while
ago: a run takes its lock a moment after it makes its folder).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

from lnk.fsutil import rmtree

HELD = ".held"  # the lock a run holds on its folder while it runs
STALE_S = 600  # a folder left this long and held by no process is a dead run's


class WorkDir:
    """A run's private folder (``path``), held until :meth:`close` removes it."""

    def __init__(self, runtime: Path, prefix: str) -> None:
        runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
        sweep(runtime, prefix)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=runtime))
        self._held = os.open(self.path / HELD, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._held, fcntl.LOCK_EX)

    def close(self) -> None:
        if self._held >= 0:
            rmtree(self.path)
            os.close(self._held)
            self._held = -1


def sweep(runtime: Path, prefix: str, now: float | None = None) -> list[str]:
    """Remove the folders named ``prefix...`` in ``runtime`` that dead runs left (no
    process holds their lock, left more than :data:`STALE_S` ago); their names."""
    now = time.time() if now is None else now
    gone: list[str] = []
    try:
        entries = list(os.scandir(runtime))
    except OSError:
        return gone
    for e in entries:
        try:
            if not e.name.startswith(prefix) or not e.is_dir(follow_symlinks=False):
                continue
            if now - e.stat(follow_symlinks=False).st_mtime < STALE_S:
                continue
            fd = os.open(f"{e.path}/{HELD}", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1  # killed before it took its lock
        except OSError:
            continue
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # a run still holds it
        rmtree(e.path)
        gone.append(e.name)
        if fd >= 0:
            os.close(fd)
    return gone
