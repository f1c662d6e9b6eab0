"""Every folder's digest as the agent is now, from one stat of each entry.

A folder's digest (docs/stream-format.md, 7.3.4) depends only on what is directly in
it (names, modes, sizes, mtimes, each file's SHA-256 as the hash cache vouches for it
by its stat) and on its subfolders' digests.  So each folder's *fingerprint* is
SHA-256 over the lstat of every entry directly in it (name, mode, size, mtime, ctime,
inode, links) and its subfolders' digests; the hash cache remembers (fingerprint,
digest, files) per folder (``HashCache.folder``), and a folder whose fingerprint is
the same has the same digest: its files' cache rows are not read and no line of its
digest is made.  An unchanged agent's digests are then one stat of each entry.

A folder is remembered only when it has a digest and nothing directly in it changed
within the clock's step of the walk (``RACY_NS``, as the hash cache's files): a
change that keeps every stat the same cannot hide behind a remembered digest.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

from lnk.payload.hashcache import RACY_NS, HashCache
from lnk.payload.manifest import EMPTY_SHA, FILE_ROOTS
from lnk.payload.walk import (
    DIGEST_TAG,
    SQLITE_SIDECARS,
    _link_target,
    _listing,
    dir_key,
    dir_line,
    entry_key,
    file_line,
    fingerprint,
    link_line,
)


class _Dir:
    """A folder being walked: its entries sorted by name, and what its subfolders gave."""

    __slots__ = ("entries", "i", "path", "rel", "seen")

    def __init__(self, rel: str, path: str) -> None:
        self.rel, self.path = rel, path
        self.entries = _listing(path)
        self.i = 0
        # (name, lstat, the subfolder's (digest, files) or None)
        self.seen: list[tuple[str, os.stat_result, tuple[str, int] | None]] = []


def tree_digests(root: Path, cache: HashCache) -> tuple[dict[str, str], dict[str, int]]:
    """Every folder's digest under the agent's file roots at ``root`` (folders without
    one are left out), and how many files each holds at any depth.

    Nothing is read but stats and the cache (a file whose stat the cache does not
    vouch for leaves its folders without a digest), SQLite databases included.  The
    same digests as a walk with ends (``walk_agent(..., ends=True)``) with
    ``hash_files=False, links=True, sqlite=False``."""
    digests: dict[str, str] = {}
    counts: dict[str, int] = {}
    fresh = time.time_ns() - RACY_NS
    for top in FILE_ROOTS:
        try:
            st = os.lstat(root / top)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            _walk(f"{root}/{top}", top, cache, fresh, digests, counts)
    return digests, counts


def _walk(
    path: str,
    rel: str,
    cache: HashCache,
    fresh: int,
    digests: dict[str, str],
    counts: dict[str, int],
) -> None:
    """One root, iteratively (any depth): a folder's digest once its subfolders' are known."""
    stack = [_Dir(rel, path)]
    while stack:
        fr = stack[-1]
        if fr.i < len(fr.entries):
            e = fr.entries[fr.i]
            fr.i += 1
            try:
                est = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone meanwhile: not in the digest (as the walk)
            if stat.S_ISDIR(est.st_mode):
                stack.append(_Dir(f"{fr.rel}/{e.name}", e.path))
            else:
                fr.seen.append((e.name, est, None))
            continue
        stack.pop()
        digest, files = _folder(fr, cache, fresh)
        counts[fr.rel] = files
        if digest:
            digests[fr.rel] = digest
        if stack:
            up = stack[-1]
            name = fr.rel.rpartition("/")[2]
            st = up.entries[up.i - 1].stat(follow_symlinks=False)
            up.seen.append((name, st, (digest, files)))


def _folder(fr: _Dir, cache: HashCache, fresh: int) -> tuple[str, int]:
    """(digest or "", files at any depth) of a folder whose entries were all seen."""
    keys = [
        entry_key(name, st) if sub is None else dir_key(name, stat.S_IMODE(st.st_mode), sub[0])
        for name, st, sub in fr.seen
    ]
    fp = fingerprint(keys)
    known = cache.folder(fr.rel)
    if known is not None and known[0] == fp:
        return known[1], known[2]
    digest, files, racy = _compute(fr, cache, fresh)
    if digest and not racy:
        cache.store_folder(fr.rel, fp, digest, files)
    return digest, files


def _compute(fr: _Dir, cache: HashCache, fresh: int) -> tuple[str, int, bool]:
    """A folder's digest from its lines (walk.py's rules), its files, and whether
    anything directly in it changed too recently to be remembered."""
    names = {e.name for e in fr.entries}
    h = hashlib.sha256(DIGEST_TAG)
    ok, files, racy = True, 0, False
    for name, st, sub in fr.seen:
        if sub is not None:
            files += sub[1]
            if sub[0]:
                h.update(
                    dir_line(name, stat.S_IMODE(st.st_mode), sub[0]).encode(
                        "utf-8", "surrogateescape"
                    )
                )
            else:
                ok = False
            continue
        if max(st.st_mtime_ns, st.st_ctime_ns) >= fresh:
            racy = True
        if stat.S_ISLNK(st.st_mode):
            target = _link_target(f"{fr.path}/{name}")
            if target is None:
                ok = False
            else:
                h.update(link_line(name, target).encode("utf-8", "surrogateescape"))
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # devices, fifos, sockets: never carried, not in a digest
        if name.endswith(SQLITE_SIDECARS) and any(
            name.endswith(s) and name[: -len(s)] in names for s in SQLITE_SIDECARS
        ):
            ok = False
            continue
        files += 1
        if not ok:
            continue
        sha = None if name + "-wal" in names else cache.lookup(f"{fr.rel}/{name}", st)
        sha = sha or (EMPTY_SHA if st.st_size == 0 else "")
        if not sha or st.st_nlink > 1:
            ok = False
        else:
            line = file_line(name, stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, sha)
            h.update(line.encode("utf-8", "surrogateescape"))
    return (h.hexdigest() if ok else ""), files, racy
