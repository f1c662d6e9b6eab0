"""What the last backup to a repository stored, so the next one need not read it again.

Per repository ID (chunk IDs are keyed by the repository's dedup key):

* a file, by its path and (size, mtime, ctime, inode) as ``fstat`` saw it while it
  was read whole: its SHA-256 and chunk IDs;
* a collection, by its kind, name and the store's watermark (which changes
  whenever the collection changes): the size and chunk IDs of its export;
* a folder, by its path and folder digest (docs/stream-format.md, 7.3.4): the lines
  the backup wrote for it (its own entry, its files' entries and tree lines, and a
  place for each subfolder, named with that subfolder's digest then), the blobs those
  lines name, and their counts.  A folder whose digest is the same is the same
  folder, so the next backup writes these lines again without reading or even
  looking up its files one by one.

A backup that finds a file or collection unchanged hands the chunk IDs to
:meth:`lnk.backup.writer.SnapshotWriter.add_known`, which checks that the
repository still holds every one (a prune may have removed them) and otherwise
reads the file as usual.  The cache lives in the agent's runtime folder, beside
the stream's SHA-256 cache; losing it only makes the next backup slower.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any, NamedTuple

import zstandard

from lnk.payload.cachedb import COMMIT_EVERY, CacheDB, insert_rows


class ChunkCache(CacheDB):
    def __init__(self, path: Path, repo_id: str) -> None:
        super().__init__(
            path,
            (
                "CREATE TABLE IF NOT EXISTS f (repo TEXT, path TEXT, size INT, mtime INT, ctime INT, "
                "ino INT, sha TEXT, chunks TEXT, PRIMARY KEY (repo, path))",
                "CREATE TABLE IF NOT EXISTS c (repo TEXT, coll TEXT, mark TEXT, size INT, "
                "records INT, chunks TEXT, PRIMARY KEY (repo, coll))",
                "CREATE TABLE IF NOT EXISTS d (repo TEXT, path BLOB, digest TEXT, body BLOB, "
                "ids BLOB, entries INT, files INT, bytes INT, PRIMARY KEY (repo, path)) "
                "WITHOUT ROWID",
            ),
        )
        self.repo = repo_id
        # file rows written in batches (one statement per batch, not per file), and
        # found here until then; a repository with no file rows yet is not asked per file
        self._files: dict[str, tuple[str, str, int, int, int, int, str, str]] = {}
        self._none_held: bool | None = None

    @staticmethod
    def key(st: os.stat_result) -> tuple[int, int, int, int]:
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def file(self, rel: str, st: os.stat_result) -> tuple[str, list[str]] | None:
        """(sha256, chunk IDs) of ``rel`` if it was stored with exactly this stat."""
        pending = self._files.get(rel)
        if pending is not None:
            row: Any = pending[2:]
        elif self._holds_none():
            return None  # a first backup here: nothing to look up
        else:
            row = self.row(
                "SELECT size, mtime, ctime, ino, sha, chunks FROM f WHERE repo=? AND path=?",
                (self.repo, rel),
            )
        if row is None or tuple(row[:4]) != self.key(st):
            return None
        ids = _ids(row[5])
        return (str(row[4]), ids) if ids or st.st_size == 0 else None

    def _holds_none(self) -> bool:
        """Whether this repository had no file rows when first asked (asked once)."""
        if self._none_held is None:
            self._none_held = self.row("SELECT 1 FROM f WHERE repo=? LIMIT 1", (self.repo,)) is None
        return self._none_held

    def store_file(self, rel: str, st: os.stat_result, sha: str, chunks: list[str]) -> None:
        if self.db is None or self.readonly:
            return
        # chunk IDs are hex (the writer's own): a JSON list without the encoder
        text = '["' + '","'.join(chunks) + '"]' if chunks else "[]"
        self._files[rel] = (self.repo, rel, *self.key(st), sha, text)
        if len(self._files) >= COMMIT_EVERY:
            self._flush_files()

    def _flush_files(self) -> None:
        rows, self._files = list(self._files.values()), {}
        if not rows or self.db is None:
            return
        try:
            insert_rows(self.db, "INSERT OR REPLACE INTO f", 8, rows)
        except sqlite3.OperationalError:  # locked by another writer: these are dropped
            self.drop()
        else:
            self.commit()

    def close(self) -> None:
        self._flush_files()
        super().close()

    def collection(self, coll: str, mark: str) -> tuple[int, int, list[str]] | None:
        """(size, records, chunk IDs) of the collection's export at watermark ``mark``."""
        row = self.row(
            "SELECT mark, size, records, chunks FROM c WHERE repo=? AND coll=?", (self.repo, coll)
        )
        if row is None or row[0] != mark:
            return None
        ids = _ids(row[3])
        return (int(row[1]), int(row[2]), ids) if ids else None

    def store_collection(
        self, coll: str, mark: str, size: int, records: int, chunks: list[str]
    ) -> None:
        self.write(
            "INSERT OR REPLACE INTO c VALUES (?,?,?,?,?,?)",
            (self.repo, coll, mark, size, records, json.dumps(chunks)),
        )


def _ids(raw: str) -> list[str]:
    try:
        v = json.loads(raw)
    except ValueError:
        return []
    return [str(x) for x in v] if isinstance(v, list) else []


class DirRow(NamedTuple):
    """What the last backup wrote for one folder (see the module's docstring)."""

    digest: str
    body: bytes  # items, each ending in a newline: b"E" entry line, b"T" tree line,
    # b"S" [name, digest] of a subfolder (JSON)
    ids: bytes  # the blob IDs its tree lines name, 32 bytes each
    entries: int
    files: int
    bytes: int


class DirCache:
    """The folder rows of :class:`ChunkCache`'s file (one connection, one transaction)."""

    def __init__(self, cache: ChunkCache) -> None:
        self.cache = cache
        self._dctx = zstandard.ZstdDecompressor()
        self._cctx = zstandard.ZstdCompressor(level=1, write_checksum=True)  # bit rot: refused

    def digests(self) -> dict[str, str]:
        """Every folder this repository has lines for: path -> digest."""
        db = self.cache.db
        if db is None:
            return {}
        rows = db.execute("SELECT path, digest FROM d WHERE repo=?", (self.cache.repo,))
        return {_text(p): str(d) for p, d in rows}

    def row(self, rel: str) -> DirRow | None:
        got = self.cache.row(
            "SELECT digest, body, ids, entries, files, bytes FROM d WHERE repo=? AND path=?",
            (self.cache.repo, _blob(rel)),
        )
        if got is None:
            return None
        try:
            body = self._dctx.decompress(got[1])
        except zstandard.ZstdError:
            return None  # damaged: the folder is backed up file by file
        return DirRow(str(got[0]), body, bytes(got[2]), int(got[3]), int(got[4]), int(got[5]))

    def store(self, rel: str, row: DirRow) -> None:
        self.cache.write(
            "INSERT OR REPLACE INTO d VALUES (?,?,?,?,?,?,?,?)",
            (
                self.cache.repo,
                _blob(rel),
                row.digest,
                self._cctx.compress(row.body),
                row.ids,
                row.entries,
                row.files,
                row.bytes,
            ),
        )

    def keep_only(self, paths: set[str]) -> None:
        """Forget the rows of folders not in ``paths`` (gone since, or changed)."""
        db = self.cache.db
        if db is None or self.cache.readonly:
            return
        stale = [
            (self.cache.repo, p)
            for (p,) in db.execute("SELECT path FROM d WHERE repo=?", (self.cache.repo,))
            if _text(p) not in paths
        ]
        db.executemany("DELETE FROM d WHERE repo=? AND path=?", stale)


def _blob(rel: str) -> bytes:
    return rel.encode("utf-8", "surrogateescape")


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
