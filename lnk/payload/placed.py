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
        for path, kind, _mode, size, sha, _grp, _mtime, _placed in stage.iter_entries():
            if kind != "f" or path in skip:
                continue
            try:
                st = os.lstat(f"{top}/{path}")
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size == size:
                yield path, st, sha

    cache = HashCache(cache_path)
    try:
        cache.store_many(placed())
    finally:
        cache.close()
