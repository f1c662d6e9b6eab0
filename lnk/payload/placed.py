"""The SHA-256 of every file a stage placed, remembered in a hash cache by its stat now,
so the next send or receive from there hashes nothing."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from lnk.payload.hashcache import HashCache
from lnk.payload.staging import Stage


def remember_placed(stage: Stage, cache_path: Path, root: Path, skipped: list[str]) -> None:
    """Each regular file of the stage's entries, where it now is under ``root`` (the
    agent's folder, or a kept bulk): only one there as written (same size) is
    remembered, keyed by its stat now, so anything that changes it later is hashed
    again.  ``skipped``: Home-relative paths not put in place."""
    skip = {f"Home/{p}" for p in skipped}
    top = str(root)

    def placed() -> Iterator[tuple[str, os.stat_result, str]]:
        # each file's lstat by its name in its folder, the folder opened once for the
        # files after it in it (a stream lists a folder's files together): not a walk
        # of the whole path a file, 100,000 times
        folder: str | None = None  # the folder open as fd (-1: it could not be opened)
        fd = -1
        try:
            for path, size, sha in stage.iter_files():
                if path in skip:
                    continue
                parent, _, name = path.rpartition("/")
                if parent != folder:
                    if fd >= 0:
                        os.close(fd)
                    folder, fd = parent, _open_folder(f"{top}/{parent}")
                if fd < 0:
                    continue
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_size == size:
                    yield path, st, sha
        finally:
            if fd >= 0:
                os.close(fd)

    cache = HashCache(cache_path)
    try:
        cache.store_many(placed())
    finally:
        cache.close()


def _open_folder(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return -1
