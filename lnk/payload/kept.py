"""A move back merges the folders the agent left here into what arrives.

When an agent moves away, its folders are kept in ``~/Link/Moved/<name>-*``
with the SHA-256 cache of its last send (``.lnk-hashes.sqlite``).  A person may
add or change files there meanwhile.  When the agent comes back, nothing of
theirs is lost:

- a file added there, or changed there while the agent left it as it was, is
  kept (it takes its place in what arrives);
- a file changed both there and in the agent is kept beside the agent's, as
  ``<name>.moved-conflict-<date>``;
- the receive reports both (``kept_from_moved``, ``conflicts``).

What changed there is told at prepare by the stats noted as the agent left: a
file whose stat is not the one noted then changed after it (its SHA-256 then is
the cache's, if any: absent for a file added there).  The move's final send
notes them (every folder's listing, :class:`SentListing`, as the digests' walk
sees it anyway), and leaving adopts that note if its stream is the one the
destination committed; else leaving walks the folders to note them
(:func:`record_left`).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk.payload.cachedb import insert_rows
from lnk.payload.digests import regular_files
from lnk.payload.hashcache import HashCache
from lnk.payload.listings import left_files
from lnk.payload.manifest import under

CONFLICT = ".moved-conflict-"


LEFT = "left"  # the kept folder's files as the agent left them: rel -> stat
LEFT_DIRS = "left_dirs"  # or each folder's listing as the agent left it: dir -> listing
SENT, SENT_BY = "sent_dirs", "sent_by"  # a final send's listings, and that send's stream
NOTES = (LEFT, LEFT_DIRS, SENT, SENT_BY)  # a hash cache's notes of how the agent left


def drop_notes(con: sqlite3.Connection) -> None:
    """Forget every note of how the agent left (a kept folder's cache becoming an agent's,
    or a new note replacing them)."""
    for table in NOTES:
        con.execute(f"DROP TABLE IF EXISTS {table}")


class SentListing:
    """A final send's note of every folder's listing (``listings.listing_text``: the lstat of
    each entry directly in it), written to the sender's hash cache as the digests' walk
    makes them; :meth:`done` names the stream, so leaving adopts the note only if the
    destination committed that very stream (the agent paused since: nothing of it
    changed but what a person changes there, which a move back then keeps)."""

    BATCH = 256  # folders a write

    def __init__(self, cache: HashCache) -> None:
        self.cache = cache
        self.rows: list[tuple[str, bytes]] = []
        self.noted = 0
        self.drops = cache.drops
        self.ok = cache.db is not None and not cache.readonly
        if cache.db is not None and self.ok:
            try:
                cache.db.execute(f"DROP TABLE IF EXISTS {SENT_BY}")
                cache.db.execute(f"DROP TABLE IF EXISTS {SENT}")
                cache.db.execute(
                    f"CREATE TABLE {SENT} (dir TEXT PRIMARY KEY, keys BLOB) WITHOUT ROWID"
                )
            except sqlite3.OperationalError:  # locked by another writer: no note
                self.ok = False

    def __call__(self, rel: str, text: bytes) -> None:
        if self.ok:
            self.noted += 1
            self.rows.append((rel, text))
            if len(self.rows) >= self.BATCH:
                self._flush()

    def _flush(self) -> None:
        if self.ok and self.rows and self.cache.db is not None:
            try:
                insert_rows(self.cache.db, f"INSERT OR REPLACE INTO {SENT}", 2, self.rows)
            except sqlite3.OperationalError:
                self.ok = False
        self.rows = []

    def done(self, stream_id: str) -> None:
        """Every folder is noted: name the stream (nothing if any row was lost, or the
        walk noted no folder)."""
        self._flush()
        db = self.cache.db
        if not self.ok or not self.noted or db is None or self.cache.drops != self.drops:
            return
        try:
            db.execute(f"CREATE TABLE {SENT_BY} (stream TEXT)")
            db.execute(f"INSERT INTO {SENT_BY} VALUES (?)", (stream_id,))
        except sqlite3.OperationalError:
            return
        self.cache.commit()


def adopt_sent(cache_path: Path, stream_id: str) -> bool:
    """(at leaving) The final send's listings become the kept folder's note of how the
    agent left it, if ``stream_id`` (the stream the destination committed) is the one
    that send named.  False if not: then :func:`record_left` walks."""
    con = sqlite3.connect(cache_path, isolation_level=None)
    try:
        try:
            row = con.execute(f"SELECT stream FROM {SENT_BY}").fetchone()
        except sqlite3.OperationalError:  # no final send noted here
            return False
        if row is None or row[0] != stream_id:
            return False
        con.execute("BEGIN")
        con.execute(f"DROP TABLE IF EXISTS {LEFT}")
        con.execute(f"DROP TABLE IF EXISTS {LEFT_DIRS}")
        con.execute(f"ALTER TABLE {SENT} RENAME TO {LEFT_DIRS}")
        con.execute(f"DROP TABLE {SENT_BY}")
        con.execute("COMMIT")
        return True
    finally:
        con.close()


def record_left(kept: Path, cache_path: Path) -> None:
    """Note every file of the kept folder as the agent left it (size, mtime, ctime,
    inode), once it stopped: a move back then tells what a person changed there by
    its stat alone, whatever the hash cache holds (a file written in the agent's last
    moments, a SQLite database)."""
    con = sqlite3.connect(cache_path)
    try:
        drop_notes(con)
        con.execute(
            f"CREATE TABLE {LEFT} (rel TEXT PRIMARY KEY, size INT, mtime INT, ctime INT, "
            "ino INT) WITHOUT ROWID"
        )
        rows: list[tuple[str, int, int, int, int]] = []
        # the files a move back's prepare will look at: those its walk finds
        for rel, st in regular_files(kept):
            rows.append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
            if len(rows) >= 5000:
                insert_rows(con, f"INSERT INTO {LEFT}", 5, rows)
                rows.clear()
        insert_rows(con, f"INSERT INTO {LEFT}", 5, rows)
        con.commit()
    finally:
        con.close()


class ChangeRecorder(HashCache):
    """The kept folder's cache, noting every file changed since the agent left it: by
    the stats noted when it left (``record_left``), else by what the cache vouches for."""

    def __init__(self, path: Path | None) -> None:
        super().__init__(path)
        self.changed: dict[str, str | None] = {}
        self.left: sqlite3.Connection | None = None
        self.listings = False  # noted as each folder's listing (LEFT_DIRS), or by file
        if path is not None and self.db is not None:
            for table in (LEFT_DIRS, LEFT):
                try:
                    self.db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall()
                except sqlite3.OperationalError:
                    continue  # left before lnk noted stats: the cache alone tells
                self.left, self.listings = self.db, table == LEFT_DIRS
                break
        self._left_dirs: dict[str, dict[str, tuple[int, int, int, int]]] = {}

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        sha = super().lookup(rel, st)
        if self.left is not None:
            d, _, name = rel.rpartition("/")
            row = self._left_folder(d).get(name)
            if row != (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino):
                self.changed[rel] = self.remembered(rel)
        elif sha is None:
            self.changed[rel] = self.remembered(rel)
        return sha

    def _left_folder(self, d: str) -> dict[str, tuple[int, int, int, int]]:
        """The files directly in folder ``d`` as the agent left them (one query a folder,
        not one a file; the folders a walk has open are held, as the hash cache's)."""
        rows = self._left_dirs.get(d)
        if rows is None:
            assert self.left is not None
            if len(self._left_dirs) >= self.DIRS_KEPT:
                self._left_dirs.clear()
            if self.listings:
                got = self.left.execute(f"SELECT keys FROM {LEFT_DIRS} WHERE dir=?", (d,))
                row = got.fetchone()
                text = row[0] if row is not None and isinstance(row[0], bytes) else b""
                rows = self._left_dirs[d] = left_files(text)
                return rows
            start = len(d) + 2  # substr() counts from 1: past "d/"
            found = self.left.execute(
                f"SELECT substr(rel, ?), size, mtime, ctime, ino FROM {LEFT} "
                "WHERE rel > ? AND rel < ? AND instr(substr(rel, ?), '/') = 0",
                (start, d + "/", d + "0", start),  # "0" follows "/": all of d/, in order
            )
            rows = self._left_dirs[d] = {r[0]: (r[1], r[2], r[3], r[4]) for r in found}
        return rows

    def store_folder(self, rel: str, fp: bytes, digest: str, files: int) -> None:
        """Not here: a folder remembered in the kept folder's cache is one remembered
        while it was the agent's, before it left (lnk/payload/digests.py)."""


def record_changes(con: sqlite3.Connection, changed: dict[str, str | None]) -> None:
    con.execute("CREATE TABLE IF NOT EXISTS changed (rel TEXT PRIMARY KEY, orig TEXT)")
    con.executemany("INSERT OR REPLACE INTO changed VALUES (?,?)", changed.items())


def _free_name(p: Path, stamp: str) -> Path:
    cand = p.with_name(f"{p.name}{CONFLICT}{stamp}")
    n = 2
    while os.path.lexists(cand):
        cand = p.with_name(f"{p.name}{CONFLICT}{stamp}-{n}")
        n += 1
    return cand


def merge(
    local: sqlite3.Connection | None,
    stage_db: sqlite3.Connection,
    base: Path,
    staged: Callable[[str], str],
    held: set[str],
) -> tuple[list[str], list[dict[str, str]], bool]:
    """Stage what a person added or changed in the kept folder ``base`` (``staged``:
    where a path of the stream is staged; ``held``: the folders the stream says are
    held here whole, which the agent has exactly as they are here).

    Returns the paths kept, the conflicts ({"path", "kept_as"}), and whether every
    one found its place (if not, the kept folder is not deleted)."""
    kept: list[str] = []
    conflicts: list[dict[str, str]] = []
    placed = True
    if local is None:
        return kept, conflicts, placed
    try:
        rows = local.execute("SELECT rel, orig FROM changed ORDER BY rel").fetchall()
    except sqlite3.OperationalError:  # prepared without a kept folder
        return kept, conflicts, placed
    stamp = time.strftime("%Y%m%d")
    for rel, orig in rows:
        if under(rel, held):
            continue  # in a folder the agent has exactly as it is here
        src = base / rel
        try:
            st = os.lstat(src)
        except OSError:
            continue  # gone again since prepare
        if not stat.S_ISREG(st.st_mode):
            continue
        cur = local.execute("SELECT sha FROM c WHERE rel=?", (rel,)).fetchone()
        cur_sha = str(cur[0]) if cur else None
        row = stage_db.execute("SELECT kind, sha FROM e WHERE path=?", (rel,)).fetchone()
        target = Path(staged(rel))
        if row is not None and row[0] == "f" and row[1] == cur_sha:
            continue  # the agent has it as it is here
        try:
            if row is None or (row[0] == "f" and orig is not None and row[1] == orig):
                # added here, or changed only here: the person's version takes its place
                if os.path.lexists(target) and not target.is_symlink() and target.is_dir():
                    raise IsADirectoryError(str(target))
                _place(src, target)
                kept.append(rel)
            else:  # changed here and in the agent: both stay, the person's beside
                beside = _free_name(target, stamp)
                _place(src, beside)
                conflicts.append({"path": rel, "kept_as": rel[: -len(target.name)] + beside.name})
        except OSError:
            placed = False  # no place for it: the kept folder stays where it is
    return kept, conflicts, placed


def _place(src: Path, dest: Path) -> None:
    parent = dest.parent
    # folders the agent no longer has come back for the person's file (never through a link)
    missing = []
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = parent.parent
    if not parent.is_dir() or parent.is_symlink():
        raise NotADirectoryError(str(parent))
    for d in reversed(missing):
        d.mkdir(mode=0o700)
    if os.path.lexists(dest):
        os.unlink(dest)
    shutil.copy2(src, dest, follow_symlinks=False)


def result(kept: list[str], conflicts: list[dict[str, str]]) -> dict[str, Any]:
    return {"kept_from_moved": kept, "conflicts": conflicts}
