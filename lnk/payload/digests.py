"""Every folder's digest as the agent is now, from one stat of each entry.

A folder's digest (docs/stream-format.md, 7.3.4) depends only on what is directly in
it (names, modes, sizes, mtimes, each file's SHA-256 as the hash cache vouches for it
by its stat) and on its subfolders' digests.  So each folder's *fingerprint* is
SHA-256 over the lstat of every entry directly in it (name, mode, size, mtime, ctime,
inode, links) and its subfolders' digests (its listing, lnk/payload/listings.py); the
hash cache remembers (fingerprint, digest, files) per folder (``HashCache.folder``),
and a folder whose fingerprint is the same has the same digest: its files' cache rows
are not read and no line of its digest is made.  An unchanged agent's digests are
then one stat of each entry.

A folder is remembered only when it has a digest and nothing directly in it changed
within the clock's step of the walk (``RACY_NS``, as the hash cache's files): a
change that keeps every stat the same cannot hide behind a remembered digest.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lnk.payload.hashcache import RACY_NS, HashCache
from lnk.payload.listings import dir_key, entry_key, listing_text, sidecar
from lnk.payload.manifest import EMPTY_SHA
from lnk.payload.pinned import Listing, Way
from lnk.payload.unchanged import SinceDigests, Times
from lnk.payload.walk import (
    DIGEST_TAG,
    WalkStats,
    _file,
    agent_roots,
    dir_line,
    file_line,
    link_line,
)


class _Dir:
    """A folder being walked: its entries sorted by name, and what its subfolders gave."""

    __slots__ = ("entered", "entries", "i", "lost", "path", "rel", "seen")

    def __init__(self, rel: str, path: str, way: Way | None) -> None:
        """``way``: at the folder, or None if the walk could not go there (gone, or no
        longer the folder listed): no entries then."""
        self.rel, self.path = rel, path
        self.entered = way is not None
        self.entries: Listing = way.listing(path) if way is not None else []
        self.i = 0
        self.lost = False
        # (name, lstat, the subfolder's (digest, files) or None)
        self.seen: list[tuple[str, os.stat_result, tuple[str, int] | None]] = []


Listed = Callable[[str, bytes], None]


def tree_digests(
    root: Path, cache: HashCache, listed: Listed | None = None, times: Times | None = None
) -> tuple[dict[str, str], dict[str, int]]:
    """Every folder's digest under the agent's file roots at ``root`` (folders without
    one are left out), and how many files each holds at any depth.

    Nothing is read but stats and the cache (a file whose stat the cache does not
    vouch for leaves its folders without a digest), SQLite databases included.  The
    same digests as a walk with ends (``walk_agent(..., ends=True)``) with
    ``hash_files=False, links=True, sqlite=False``.  ``listed(folder, text)`` hears
    each folder's :func:`listing_text` (the lstat of every entry directly in it);
    ``times`` is filled with each folder's change times (:data:`unchanged.Times`)."""
    return _tree(root, Files(cache, listed, times))


Note = Callable[[list[tuple[str, str, str]]], None]  # (sha256, source, rel) of files
CacheRows = Callable[[str, str, list[str]], bool]
"""``rows(folder, its path, names)``: the cache's row of each of the folder's files named
(none empty) taken into the index as ``Note``'s; False, and nothing taken, if a row is
missing."""


def keeper(
    held: dict[str, str],
    root: Path,
    cache: HashCache,
    accept: Callable[[str, str, int], bool] | None = None,
    listed: Listed | None = None,
    since: SinceDigests | None = None,
) -> Callable[[str], str] | None:
    """For ``walk_agent(keep=...)``: the folders the other end holds (``held``: path ->
    digest) whose digest is that one now, every digest computed before the walk; with
    ``since``, also the folders inside those that have not changed since the digests
    the other end named them by (:meth:`SinceDigests.quiet`), with their digest now.
    ``accept(path, digest, files)`` has the last word (a backup checks it can write
    the folder from what it stored); ``listed`` as :func:`tree_digests`'s."""
    if not held:
        return None
    times: Times | None = {} if since else None
    now, files = tree_digests(root, cache, listed, times)
    quiet = since.quiet(times) if since and times is not None else set()

    def keep(rel: str) -> str:
        digest = now.get(rel, "") if rel in quiet else held.get(rel, "")
        if not digest or now.get(rel) != digest:
            return ""
        return digest if accept is None or accept(rel, digest, files.get(rel, 0)) else ""

    return keep


def index_tree(
    root: Path, cache: HashCache, snap_dir: Path, note: Note, rows: CacheRows
) -> tuple[dict[str, str], dict[str, int]]:
    """:func:`tree_digests` for a receiver's index of its base: every file's content
    digest is known (read and hashed where the cache does not vouch for it, a SQLite
    database through a snapshot in ``snap_dir``), and ``note([(sha256, source, rel),
    ...])`` is called with the files, a folder's at a time.  The digests a walk with
    ends gives with ``links=True``.

    A file of a folder the cache remembers comes from its cache row, without
    ``cache.lookup`` (a kept folder's cache notes changes there: none can be where
    every stat is as when the folder was remembered, before the agent left): ``rows``
    takes those (in SQL, not one a file here)."""
    return _tree(root, Indexed(cache, snap_dir, note, rows))


class Files:
    """How a folder's files come into its digest: by what the hash cache vouches for."""

    def __init__(
        self, cache: HashCache, listed: Listed | None = None, times: Times | None = None
    ) -> None:
        self.cache = cache
        self.listed = listed
        self.times = times

    def sha(self, fr: _Dir, name: str, st: os.stat_result, wal: bool) -> str:
        """A file's content digest for its folder's digest, or "" (no digest then)."""
        sha = None if wal else self.cache.lookup(f"{fr.rel}/{name}", st)
        if st.st_nlink > 1:
            return ""
        return sha or (EMPTY_SHA if st.st_size == 0 else "")

    def remembered(self, fr: _Dir) -> bool:
        """A folder remembered with these stats: whatever its files need besides."""
        return True


class Indexed(Files):
    def __init__(self, cache: HashCache, snap_dir: Path, note: Note, rows: CacheRows) -> None:
        super().__init__(cache)
        self.snap_dir, self.note, self.rows = snap_dir, note, rows
        self.stats = WalkStats()
        self.groups: dict[tuple[int, int, bool], int] = {}

    def sha(self, fr: _Dir, name: str, st: os.stat_result, wal: bool) -> str:
        rel = f"{fr.rel}/{name}"
        f = _file(
            f"{fr.path}/{name}", rel, st, self.cache, self.stats, self.groups, self.snap_dir,
            wal=wal,
        )  # fmt: skip
        if f.source is not None and (f.sha256 or not f.size):
            self.note([(f.sha256 or EMPTY_SHA, str(f.source), rel)])
        if f.snapshot or f.group is not None:
            return ""
        return f.sha256 or (EMPTY_SHA if f.size == 0 else "")

    def remembered(self, fr: _Dir) -> bool:
        # the folder's cache rows, taken as they are (not through the cache's lookup,
        # which a kept folder's overrides to note changes).  Not compared with the stats
        # again: the folder's fingerprint is every entry's lstat as when it was
        # remembered, and then each file's row was that lstat's (a row written since is
        # of another lstat, so of another fingerprint)
        path, rel = fr.path, fr.rel
        names = {name for name, _ in fr.entries}
        full: list[str] = []
        empty: list[str] = []
        for name, st, sub in fr.seen:
            if sub is None and stat.S_ISREG(st.st_mode) and not sidecar(name, names):
                (full if st.st_size else empty).append(name)
        if not self.rows(rel, path, full):
            return False  # a row is gone: the folder is read as if not remembered
        self.note([(EMPTY_SHA, f"{path}/{n}", f"{rel}/{n}") for n in empty])
        return True


def regular_files(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Each regular file under the agent's file roots and its lstat, as a walk finds them
    (a SQLite database's sidecars left out): a stat of each entry, nothing read."""
    for top, path, st in agent_roots(root):
        try:
            way = Way(str(path), st)
        except OSError:
            continue
        with way:
            yield from _regular(way, top, str(path))


def _regular(way: Way, rel: str, path: str) -> Iterator[tuple[str, os.stat_result]]:
    stack = [_Dir(rel, path, way)]
    while stack:
        fr = stack[-1]
        if fr.i == len(fr.entries):
            stack.pop()
            if stack and fr.entered and not way.up():
                stack[-1].entries = stack[-1].entries[: stack[-1].i]  # lost: no more
            continue
        if fr.i == 0:
            names = {name for name, _ in fr.entries}
            for name, est in fr.entries:
                if stat.S_ISREG(est.st_mode) and not sidecar(name, names):
                    yield f"{fr.rel}/{name}", est
        name, est = fr.entries[fr.i]
        fr.i += 1
        if stat.S_ISDIR(est.st_mode):
            there = way.down(name, est)
            stack.append(_Dir(f"{fr.rel}/{name}", f"{fr.path}/{name}", way if there else None))


def _tree(root: Path, files: Files) -> tuple[dict[str, str], dict[str, int]]:
    digests: dict[str, str] = {}
    counts: dict[str, int] = {}
    fresh = time.time_ns() - RACY_NS
    for top, path, st in agent_roots(root):
        try:
            way = Way(str(path), st)
        except OSError:
            continue  # gone, or no longer that folder, since its lstat
        with way:
            _walk(way, str(path), top, files, fresh, digests, counts, st.st_ctime_ns)
    return digests, counts


def _walk(
    way: Way,
    path: str,
    rel: str,
    files: Files,
    fresh: int,
    digests: dict[str, str],
    counts: dict[str, int],
    root_ctime: int = 0,
) -> None:
    """One root, iteratively (any depth): a folder's digest once its subfolders' are known."""
    stack = [_Dir(rel, path, way)]
    isdir = stat.S_ISDIR
    while stack:
        fr = stack[-1]
        entries, i = fr.entries, fr.i
        if i < len(entries):
            # the files up to the next subfolder in one go (the walk's hot loop)
            seen = fr.seen
            for name, est in itertools.islice(entries, i, None):
                i += 1
                if isdir(est.st_mode):
                    fr.i = i
                    there = way.down(name, est)
                    stack.append(
                        _Dir(f"{fr.rel}/{name}", f"{fr.path}/{name}", way if there else None)
                    )
                    break
                seen.append((name, est, None))
            else:
                fr.i = i
            continue
        stack.pop()
        # (the way still at the folder: its links are read through it)
        digest, n = _folder(fr, files, fresh, way) if fr.entered and not fr.lost else ("", 0)
        if stack and fr.entered and not way.up():
            # the folder above cannot be found as it was: nothing more of it, no digest
            stack[-1].entries = stack[-1].entries[: stack[-1].i]
            stack[-1].lost = True
        counts[fr.rel] = n
        if digest:
            digests[fr.rel] = digest
        own = root_ctime
        if stack:
            up = stack[-1]
            name = fr.rel.rpartition("/")[2]
            st = up.entries[up.i - 1][1]
            up.seen.append((name, st, (digest, n)))
            own = st.st_ctime_ns
        if files.times is not None:
            files.times[fr.rel] = (own, _newest(fr, own, files.times))


def _newest(fr: _Dir, own: int, times: Times) -> int:
    """The newest change time in a folder at any depth (its own included)."""
    newest = own
    for name, st, sub in fr.seen:
        # (a subfolder the walk has no times for counts as changed now)
        inner = st.st_ctime_ns if sub is None else times.get(f"{fr.rel}/{name}", (0, 1 << 63))[1]
        newest = max(newest, inner)
    return newest


def _folder(fr: _Dir, files: Files, fresh: int, way: Way) -> tuple[str, int]:
    """(digest or "", files at any depth) of a folder whose entries were all seen."""
    keys = [
        entry_key(name, st) if sub is None else dir_key(name, stat.S_IMODE(st.st_mode), sub[0])
        for name, st, sub in fr.seen
    ]
    text = listing_text(keys)
    fp = hashlib.sha256(text).digest()
    if files.listed is not None:
        files.listed(fr.rel, text)
    known = files.cache.folder(fr.rel)
    if known is not None and known[0] == fp and files.remembered(fr):
        return known[1], known[2]
    names = {name for name, _ in fr.entries}
    digest, n, racy = _compute(fr, files, names, fresh, way)
    if digest and not racy:
        files.cache.store_folder(fr.rel, fp, digest, n)
    return digest, n


def _compute(
    fr: _Dir, files: Files, names: set[str], fresh: int, way: Way
) -> tuple[str, int, bool]:
    """A folder's digest from its lines (walk.py's rules), its files at any depth, and
    whether anything directly in it changed too recently to be remembered."""
    h = hashlib.sha256(DIGEST_TAG)
    ok, n, racy = True, 0, False
    for name, st, sub in fr.seen:
        if sub is not None:
            n += sub[1]
            if sub[0]:
                line = dir_line(name, stat.S_IMODE(st.st_mode), sub[0])
                h.update(line.encode("utf-8", "surrogateescape"))
            else:
                ok = False
            continue
        if max(st.st_mtime_ns, st.st_ctime_ns) >= fresh:
            racy = True
        if stat.S_ISLNK(st.st_mode):
            target = way.readlink(name)
            if target is None:
                ok = False
            else:
                h.update(link_line(name, target).encode("utf-8", "surrogateescape"))
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # devices, fifos, sockets: never carried, not in a digest
        if sidecar(name, names):
            ok = False
            continue
        n += 1
        sha = files.sha(fr, name, st, name + "-wal" in names)
        if not sha:
            ok = False
        elif ok:
            line = file_line(name, stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, sha)
            h.update(line.encode("utf-8", "surrogateescape"))
    return (h.hexdigest() if ok else ""), n, racy
