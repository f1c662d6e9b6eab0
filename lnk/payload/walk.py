"""Walking an agent's files for a stream: never following a link, hashing each file once.

Only folders and regular files travel.  Symbolic links are never followed nor
carried, and devices, fifos and sockets are skipped (both counted).  Files that
share an inode are one hard-link group.  A SQLite database is read through
SQLite's online backup API into a private snapshot, never copied live.

SHA-256s are cached per path by (size, mtime, ctime, inode) in the agent's
runtime folder, so a second send reads only what changed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lnk.payload.hashcache import HashCache
from lnk.payload.manifest import EMPTY_SHA, FILE_ROOTS, dir_mode, file_mode, read_only
from lnk.payload.pinned import (
    GONE,
    Way,
    sha256_file,
    sha256_walked,
    starts_as_sqlite,
)
from lnk.payload.pinned import SQLITE_MAGIC as SQLITE_MAGIC
from lnk.payload.pinned import SQLITE_SIDECARS as SQLITE_SIDECARS
from lnk.payload.snapshots import sqlite_snapshot


@dataclass(slots=True)
class WalkedFile:
    rel: str  # path in the stream, e.g. "Home/notes.txt"
    kind: str  # "f" or "d"
    mode: int
    size: int = 0
    sha256: str = ""
    mtime_ns: int = 0
    group: int | None = None  # hard-link group number
    group_first: bool = True  # the first entry of its group carries the bytes
    source: Path | str | None = None  # where to read the bytes (a snapshot for SQLite)
    snapshot: bool = False  # source is a private snapshot, not the file itself
    target: str = ""  # a symbolic link's target text (kind "l")
    kept: str = ""  # kind "d": the receiver holds this folder whole, with this digest
    # its stat when its SHA-256 was known (walk or read); a link's or a folder's lstat
    st: os.stat_result | None = None
    read_at: int = 0  # when that read began (time_ns); 0: the hash cache vouched for it
    # kind "e": the devices, fifos and sockets directly in the folder, by name, with their
    # lstat (never carried, in no digest; in the folder's fingerprint, digests.py)
    skipped: tuple[tuple[str, os.stat_result], ...] = ()


@dataclass
class WalkStats:
    files: int = 0
    folders: int = 0
    bytes: int = 0
    skipped_links: int = 0
    links: int = 0  # carried as links
    skipped_special: int = 0
    hashed_bytes: int = 0
    snapshots: list[Path] = field(default_factory=list)


DIGEST_TAG = b"lnk-dir-1\n"


def file_line(name: str, mode: int, size: int, mtime_ns: int, sha: str) -> str:
    """A file's line in its folder's digest (its mode as a receiver writes it)."""
    return f"f\0{name}\0{file_mode(mode):o}\0{size}\0{mtime_ns}\0{sha}\n"


def link_line(name: str, target: str) -> str:
    return f"l\0{name}\0{target}\n"


def dir_line(name: str, mode: int, digest: str) -> str:
    """A subfolder's line in its folder's digest (its mode as a receiver makes it)."""
    return f"d\0{name}\0{dir_mode(mode):o}\0{digest}\n"


class _Frame:
    """A folder being walked: its sorted entries, and the digest of those seen so far."""

    __slots__ = ("entered", "entries", "h", "it", "mode", "names", "ok", "path", "rel", "skipped")

    def __init__(self, rel: str, mode: int, path: str, digest: bool, way: Way | None) -> None:
        """``way``: at the folder (its entries are listed), or None if it could not go
        there (gone, or no longer the folder its listing saw): no entries, no digest."""
        self.rel, self.mode, self.path = rel, mode, path
        self.entered = way is not None
        self.entries = way.listing(path) if way is not None else []
        self.it = iter(self.entries)
        self.names: set[str] | None = None  # made the first time a sidecar is seen
        self.h = hashlib.sha256(DIGEST_TAG) if digest else None
        self.ok = digest and self.entered
        self.skipped: list[tuple[str, os.stat_result]] = []

    def line(self, text: str) -> None:
        """One entry of the folder's digest (entries come sorted by name)."""
        if self.ok:
            assert self.h is not None
            self.h.update(text.encode("utf-8", "surrogateescape"))

    def has(self, name: str) -> bool:
        if self.names is None:
            self.names = {name for name, _ in self.entries}
        return name in self.names

    def digest(self) -> str:
        return self.h.hexdigest() if self.ok and self.h is not None else ""


def agent_roots(agent_root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """The agent's file roots that are folders here: (root, its path, its lstat)."""
    for root in FILE_ROOTS:
        top = agent_root / root
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            yield root, top, st


def walk_agent(
    agent_root: Path,
    cache: HashCache,
    stats: WalkStats,
    snapshot_dir: Path | None = None,
    *,
    hash_files: bool = True,
    links: bool = False,
    sqlite: bool = True,
    ends: bool = False,
    keep: Callable[[str], str] | None = None,
) -> Iterator[WalkedFile]:
    """Every folder and regular file under the agent's file roots, in a stable order.

    ``keep(path)``: a folder for which it gives a digest comes as one entry with that
    digest (``kept``: the receiver holds it whole) and none of its contents.

    ``ends=True``: after a folder's contents comes its end (kind "e"), whose
    ``sha256`` is the folder's digest (docs/stream-format.md, "Folder digests"),
    or "" when the folder holds something a digest does not vouch for (a file
    whose SHA-256 is not known, a hard link, a SQLite database, a skipped link).

    ``sqlite=False``: SQLite databases are not told from other files here (the caller
    looks at the first bytes it reads, and snapshots them itself).
    ``links=True``: symbolic links are yielded too (kind "l", their target text, never
    followed); otherwise they are skipped and counted.

    ``hash_files=False``: a file the cache does not know gets ``sha256 = ""`` (for a
    caller that reads and hashes every file anyway, such as a backup)."""
    groups: dict[tuple[int, int, bool], int] = {}
    # a folder for SQLite snapshots only when databases are snapshotted here
    snap_dir = snapshot_dir or (Path(tempfile.mkdtemp(prefix="lnk-snap-")) if sqlite else None)
    for root, top, st in agent_roots(agent_root):
        kept = keep(root) if keep is not None else ""
        if kept:
            yield WalkedFile(root, "d", stat.S_IMODE(st.st_mode), kept=kept, st=st)
            continue
        yield from walk_dir(
            top, root, st, cache, stats, groups, snap_dir, hash_files, links, sqlite, ends, keep
        )


def walk_dir(
    path: Path,
    rel: str,
    st: os.stat_result,
    cache: HashCache,
    stats: WalkStats,
    groups: dict[tuple[int, int, bool], int],
    snap_dir: Path | None,
    hash_files: bool = True,
    links: bool = False,
    sqlite: bool = True,
    ends: bool = False,
    keep: Callable[[str], str] | None = None,
) -> Iterator[WalkedFile]:
    """One root (its lstat ``st``), depth first, a folder before its contents;
    iterative (any depth), each folder listed through its own descriptor
    (``pinned.Way``: never through a link, whatever changes meanwhile).

    With ``ends``, each folder's end follows its contents, carrying its digest."""
    stats.folders += 1
    yield WalkedFile(rel, "d", stat.S_IMODE(st.st_mode), st=st)
    try:
        way: Way | None = Way(str(path), st)
    except OSError:
        way = None  # gone, or no longer that folder, since its lstat
    try:
        stack = [_Frame(rel, stat.S_IMODE(st.st_mode), str(path), ends, way)]
        while stack:
            fr = stack[-1]
            e = next(fr.it, None)
            if e is None:
                stack.pop()
                if stack and fr.entered:
                    assert way is not None
                    if not way.up():
                        # the folder above cannot be found as it was: nothing more of it
                        stack[-1].ok = False
                        stack[-1].it = iter(())
                if ends:
                    digest = fr.digest()
                    if stack:
                        up = stack[-1]
                        if digest:
                            name = fr.rel.rpartition("/")[2]
                            up.line(dir_line(name, fr.mode, digest))
                        else:
                            up.ok = False
                    yield WalkedFile(fr.rel, "e", fr.mode, sha256=digest, skipped=tuple(fr.skipped))
                continue
            name, est = e
            erel = f"{fr.rel}/{name}"
            epath = f"{fr.path}/{name}"
            if stat.S_ISLNK(est.st_mode):
                target = way.readlink(name) if links and way is not None else None
                if target is None:
                    stats.skipped_links += 1
                    fr.ok = False
                else:
                    stats.links += 1
                    fr.line(link_line(name, target))
                    yield WalkedFile(erel, "l", 0o777, target=target, st=est)
                continue
            if stat.S_ISDIR(est.st_mode):
                stats.folders += 1
                mode = stat.S_IMODE(est.st_mode)
                kept = keep(erel) if keep is not None else ""
                if kept:
                    yield WalkedFile(erel, "d", mode, kept=kept, st=est)
                    continue
                yield WalkedFile(erel, "d", mode, st=est)
                there = way is not None and way.down(name, est)
                stack.append(_Frame(erel, mode, epath, ends, way if there else None))
                continue
            if not stat.S_ISREG(est.st_mode):
                stats.skipped_special += 1  # never carried, never deleted: not in a digest
                if ends:
                    fr.skipped.append((name, est))
                continue
            if name.endswith(SQLITE_SIDECARS) and any(
                name.endswith(s) and fr.has(name[: -len(s)]) for s in SQLITE_SIDECARS
            ):
                fr.ok = False
                continue  # folded into the database's snapshot
            # a database with a write-ahead log beside it may have changed with its stat
            # unchanged (the log holds the commits until a checkpoint): no cache vouches for it
            wal = fr.has(name + "-wal")
            f = _file(epath, erel, est, cache, stats, groups, snap_dir, hash_files, sqlite, wal)
            sha = f.sha256 or (EMPTY_SHA if f.size == 0 else "")
            if not sha or f.snapshot or f.group is not None:
                fr.ok = False
            else:
                fr.line(file_line(name, f.mode, f.size, f.mtime_ns, sha))
            yield f
    finally:
        if way is not None:
            way.close()


def _file(
    path: Path | str,
    rel: str,
    st: os.stat_result,
    cache: HashCache,
    stats: WalkStats,
    groups: dict[tuple[int, int, bool], int],
    snap_dir: Path | None,
    hash_files: bool = True,
    sqlite: bool = True,
    wal: bool = False,
) -> WalkedFile:
    stats.files += 1
    mode = stat.S_IMODE(st.st_mode)
    group, first = None, True
    if st.st_nlink > 1:
        # a group never joins a read-only folder of Agent/ to a writable one (the receiver
        # refuses it): the other side's links are a group of their own
        key = (st.st_dev, st.st_ino, read_only(rel))
        if key in groups:
            group, first = groups[key], False
        else:
            group = groups[key] = len(groups)
    # a cache hit was hashed as a plain file with this very stat: not SQLite, not read
    sha = None if wal else cache.lookup(rel, st)
    db = sqlite and sha is None and st.st_size >= 16  # a database? its first bytes tell
    snap = None
    if sha is None and hash_files:
        # one open: the first bytes say whether it is a database, the rest is hashed
        sha = _hashed(path, rel, st, stats, cache, db)
        if sha is None:
            assert snap_dir is not None
            snap = sqlite_snapshot(path, snap_dir, rel, st)
            if snap is None:  # not one SQLite can read: its bytes as they are
                sha = _hashed(path, rel, st, stats, cache, False)
    elif db and starts_as_sqlite(path, rel, st):
        assert snap_dir is not None
        snap = sqlite_snapshot(path, snap_dir, rel, st)
    if snap is not None:
        stats.snapshots.append(snap)
        size = snap.stat().st_size
        stats.hashed_bytes += size
        stats.bytes += size
        return WalkedFile(
            rel, "f", mode, size, sha256_file(snap), st.st_mtime_ns, group, first, snap, True
        )
    stats.bytes += st.st_size
    return WalkedFile(
        rel, "f", mode, st.st_size, sha or "", st.st_mtime_ns, group, first, path, st=st
    )


def _hashed(
    path: Path | str,
    rel: str,
    st: os.stat_result,
    stats: WalkStats,
    cache: HashCache,
    unless_sqlite: bool,
) -> str | None:
    """The file's SHA-256, remembered; "" if it is gone or a link is on its way now (not
    known: its folder gets no digest); None, nothing more read, if ``unless_sqlite`` and
    it starts as a SQLite database."""
    try:
        sha = sha256_walked(path, rel, st, unless_sqlite)
    except OSError as e:
        if e.errno not in GONE:
            raise
        return ""
    if sha is not None:
        stats.hashed_bytes += st.st_size
        cache.store(rel, st, sha)
    return sha
