"""Staging what a stream says the receiver holds already: folders of the
receiver's base held here whole (checked against the base as it is now, walked
beside the stream), and file content that arrives with no bytes (found in the
receiver's objects, or a link to an earlier member of the stream).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from lnk.payload import manifest as M
from lnk.payload.digests import tree_digests
from lnk.payload.hashcache import HashCache
from lnk.payload.receivers import Receiver


class HeldStaging:
    """The held part of a ``Stage`` (lnk/payload/staging.py)."""

    r: Receiver
    db: sqlite3.Connection
    base_now: Future[tuple[dict[str, str], dict[str, int]]] | None
    base_pool: ThreadPoolExecutor | None
    unresolved: list[M.FileEntry]
    unsettled: set[str]
    staged: Callable[[str], str]  # where an entry is staged (Stage.staged)
    keep_objects: bool  # (not for a restore: a snapshot carries every file's bytes)

    def look_at_base(self) -> None:
        """A stream may say folders of the receiver's base are held here whole: each is
        checked at use, against what the base holds now.  That walk of the base starts
        as the stream starts, beside it (the stream mostly waits on the sender)."""
        info = self.r.info()
        base, cache = info.get("base_root"), info.get("base_cache")
        if not base or not cache or self.r.inventory_dirs() == 0:
            return
        if self.r.own_base():  # a bulk it kept: read from its index (base_walked)
            return
        self.base_pool = ThreadPoolExecutor(1, "lnk-base")
        self.base_now = self.base_pool.submit(_digests_now, Path(base), Path(cache))

    def base_walked(self) -> tuple[dict[str, str], dict[str, int]] | None:
        """What the walk of the base beside the stream found (None if it did not run
        or failed); for the receiver's own kept bulk, where nothing but this receiver
        writes, its folders' digests as indexed."""
        if self.base_now is None:
            return (self.r.indexed_digests(), {}) if self.r.own_base() else None
        try:
            return self.base_now.result()
        except Exception:  # the caller walks again
            return None

    def held_folders(self) -> list[tuple[str, str]]:
        """The folders this stream says the receiver holds whole: (path, digest)."""
        return self.db.execute(
            "SELECT path, sha FROM e WHERE kind='d' AND sha != '' ORDER BY i"
        ).fetchall()

    def _check_kept(self, e: M.FileEntry) -> None:
        """A folder said to be held here whole: the receiver's base holds it, with that
        digest, at that path (as indexed at prepare; checked again at use)."""
        if self.r.dir_digest(e.path) != e.kept:
            raise M.bad(
                f"{e.path!r} is said to be held here whole, but this machine's receiver "
                "indexed no such folder there"
            )

    def _resolve_unresolved(self) -> None:
        shas = [e.sha256 for e in self.unresolved if e.size]
        held = self.r.held_among(shas)
        missing = set(shas) - held - self.unsettled
        if missing and self.keep_objects:
            held |= self._link_staged(missing)
        for e in self.unresolved:
            if e.size == 0:
                if e.sha256 != M.EMPTY_SHA:
                    raise M.bad(f"{e.path!r} is empty but its SHA-256 is not that of nothing")
                continue
            if e.group is not None:
                first = self.db.execute("SELECT MIN(i) FROM e WHERE grp=?", (e.group,)).fetchone()
                mine = self.db.execute("SELECT i FROM e WHERE path=?", (e.path,)).fetchone()
                if first[0] != mine[0]:
                    continue  # a link to an earlier member of this stream
            if e.sha256 in self.unsettled:
                continue  # a bulk's unsettled content: never applied (only bulks have any)
            if e.sha256 not in held:
                raise M.bad(
                    f"{e.path!r} carries no bytes and its content is held nowhere "
                    "here (a link to something outside the stream?)"
                )
        self.unresolved = []

    def _link_staged(self, shas: set[str]) -> set[str]:
        """Content carried earlier in this stream, staged where its entry goes but not
        linked into the objects as it arrived (a small file: staging.ADOPT_MIN), linked
        there now: the objects are where every entry without bytes finds its content."""
        self.db.execute("CREATE INDEX IF NOT EXISTS e_sha ON e(sha)")  # one sort, if asked
        found = set()
        for sha in shas:
            row = self.db.execute(
                "SELECT path FROM e WHERE sha=? AND kind='f' AND placed LIMIT 1", (sha,)
            ).fetchone()
            if row is None:
                continue
            with contextlib.suppress(FileExistsError):
                os.link(self.staged(row[0]), f"{self.r.objects_s}/{sha}", follow_symlinks=False)
            found.add(sha)
        return found


def _digests_now(base: Path, cache_path: Path) -> tuple[dict[str, str], dict[str, int]]:
    cache = HashCache(cache_path, readonly=True)
    try:
        return tree_digests(base, cache)
    finally:
        cache.close()
