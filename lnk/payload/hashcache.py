"""The SHA-256 cache of an agent's files: path -> SHA-256, valid while the file's
stat (size, mtime, ctime, inode) stays the same; and each folder's digest, valid
while the stat of every entry directly in it, and its subfolders' digests, stay
the same (``folder``: so a walk that only wants digests reads no file's row).

It lives in the agent's runtime folder (``hashes.sqlite``), and beside the folders
an agent left when it moved away (``.lnk-hashes.sqlite``), so a send, a prepare
or a receive's check reads only what changed.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from lnk.payload.cachedb import COMMIT_EVERY, CacheDB, insert_rows

DIGEST = re.compile("[0-9a-f]{64}")

# a file changed this close to when it was read may change again within the clock's step
# and keep its stat: such a read is not remembered (git's "racily clean")
RACY_NS = 2_000_000_000


H2_COLUMNS = (
    "(dir TEXT, name TEXT, size INT, mtime INT, ctime INT, ino INT, sha TEXT, "
    "PRIMARY KEY (dir, name)) WITHOUT ROWID"
)
"""The files' table, as lnk makes it: one row at most a name in a folder, matched as
named (binary text)."""


class HashCache(CacheDB):
    """path -> sha256, valid while (size, mtime_ns, ctime_ns, inode) stay the same.

    Rows are keyed by (folder, name) and read a folder at a time (one query per
    folder, not per file); writes go in batches of a few thousand."""

    DIRS_KEPT = 64  # folders whose rows are held (a walk goes in and out of a few)

    def __init__(self, path: Path | None, readonly: bool = False) -> None:
        super().__init__(
            path,
            (
                "DROP TABLE IF EXISTS h",  # the one-row-per-path cache before folders
                f"CREATE TABLE IF NOT EXISTS h2 {H2_COLUMNS}",
                "CREATE TABLE IF NOT EXISTS dg (dir TEXT PRIMARY KEY, fp BLOB, digest TEXT, "
                "files INT) WITHOUT ROWID",
            ),
            readonly,
        )
        self._dirs: dict[str, dict[str, tuple[int, int, int, int, str]]] = {}
        self._rows: list[tuple[str, str, int, int, int, int, str]] = []
        self._folders: dict[str, tuple[bytes, str, int]] = {}  # not written yet

    def _folder(self, d: str) -> dict[str, tuple[int, int, int, int, str]]:
        rows = self._dirs.get(d)
        if rows is None:
            if len(self._dirs) >= self.DIRS_KEPT:
                self._dirs.clear()
            rows = {}
            if self.db is not None:
                self._flush_rows(commit=False)  # seen by the query, committed later
                try:
                    found = self.db.execute(
                        "SELECT name, size, mtime, ctime, ino, sha FROM h2 WHERE dir=?", (d,)
                    ).fetchall()
                except sqlite3.OperationalError:  # read-only, and no table yet
                    found = []
                for name, size, mtime, ctime, ino, sha in found:
                    rows[name] = (size, mtime, ctime, ino, sha)
            self._dirs[d] = rows
        return rows

    def remembered(self, rel: str) -> str | None:
        """The SHA-256 remembered for ``rel``, whatever its stat is now."""
        d, _, name = rel.rpartition("/")
        row = self._folder(d).get(name)
        return row[4] if row else None

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        d, _, name = rel.rpartition("/")
        rows = self._dirs.get(d)
        row = (self._folder(d) if rows is None else rows).get(name)
        if row and row[:4] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino):
            return row[4]
        return None

    def store(self, rel: str, st: os.stat_result, sha: str) -> None:
        if self.db is None or self.readonly:
            return
        d, _, name = rel.rpartition("/")
        row = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha)
        held = self._dirs.get(d)
        if held is not None:
            held[name] = row
        self._rows.append((d, name, *row))
        if len(self._rows) >= COMMIT_EVERY:
            self._flush_rows()

    def store_many(self, files: Iterable[tuple[str, os.stat_result, str]]) -> None:
        """:meth:`store` for many files (a receive remembering all it wrote) at once:
        rows in batches, none held for lookups (the folders held are forgotten)."""
        if self.db is None or self.readonly:
            return
        self._dirs.clear()
        rows = self._rows
        for rel, st, sha in files:
            d, _, name = rel.rpartition("/")
            rows.append((d, name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha))
            if len(rows) >= COMMIT_EVERY:
                self._flush_rows()
                rows = self._rows

    def folder(self, rel: str) -> tuple[bytes, str, int] | None:
        """(fingerprint, digest, files at any depth) remembered for the folder ``rel``:
        valid while its fingerprint (lnk/payload/digests.py) is the same."""
        pending = self._folders.get(rel)
        if pending is not None or self.db is None:
            return pending
        try:
            row = self.db.execute("SELECT fp, digest, files FROM dg WHERE dir=?", (rel,)).fetchone()
        except sqlite3.OperationalError:  # read-only, and no table yet
            return None
        # a file on disk: a row of another shape is no word at all (the folder is read)
        if row is None or not isinstance(row[0], bytes) or not isinstance(row[2], int):
            return None
        fp, digest, files = row
        if not (isinstance(digest, str) and DIGEST.fullmatch(digest) and files >= 0):
            return None
        return fp, digest, files

    def store_folder(self, rel: str, fp: bytes, digest: str, files: int) -> None:
        if self.db is None or self.readonly:
            return
        self._folders[rel] = (fp, digest, files)
        if len(self._folders) >= COMMIT_EVERY:
            self._flush_rows()

    def _flush_rows(self, commit: bool = True) -> None:
        """The rows held, written; committed with ``commit`` or once a few thousand are
        written and not committed (not a commit a folder: a first send asks a folder's
        rows before each folder, with the rows of the one before held)."""
        if (self._rows or self._folders) and self.db is not None:
            written = len(self._rows) + len(self._folders)
            try:
                insert_rows(self.db, "INSERT OR REPLACE INTO h2", 7, self._rows)
                insert_rows(
                    self.db,
                    "INSERT OR REPLACE INTO dg",
                    4,
                    [(rel, *row) for rel, row in self._folders.items()],
                )
            except sqlite3.OperationalError:  # locked by another writer: these are dropped
                self.drop()
            else:
                self.pending += written
                if commit or self.pending >= COMMIT_EVERY:
                    self.commit()
            self._rows = []
            self._folders = {}

    def close(self) -> None:
        self._flush_rows()
        super().close()
