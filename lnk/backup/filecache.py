"""What the last backup to a repository stored, so the next one need not read it again.

Per repository ID (chunk IDs are keyed by the repository's dedup key):

* a file, by its path and (size, mtime, ctime, inode) as ``fstat`` saw it while it
  was read whole: its SHA-256 and chunk IDs;
* a collection, by its kind, name and the store's watermark (which changes
  whenever the collection changes): the size and chunk IDs of its export.

A backup that finds a file or collection unchanged hands the chunk IDs to
:meth:`lnk.backup.writer.SnapshotWriter.add_known`, which checks that the
repository still holds every one (a prune may have removed them) and otherwise
reads the file as usual.  The cache lives in the agent's runtime folder, beside
the stream's SHA-256 cache; losing it only makes the next backup slower.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lnk.payload.cachedb import CacheDB


class ChunkCache(CacheDB):
    def __init__(self, path: Path, repo_id: str) -> None:
        super().__init__(
            path,
            (
                "CREATE TABLE IF NOT EXISTS f (repo TEXT, path TEXT, size INT, mtime INT, ctime INT, "
                "ino INT, sha TEXT, chunks TEXT, PRIMARY KEY (repo, path))",
                "CREATE TABLE IF NOT EXISTS c (repo TEXT, coll TEXT, mark TEXT, size INT, "
                "records INT, chunks TEXT, PRIMARY KEY (repo, coll))",
            ),
        )
        self.repo = repo_id

    @staticmethod
    def key(st: os.stat_result) -> tuple[int, int, int, int]:
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def file(self, rel: str, st: os.stat_result) -> tuple[str, list[str]] | None:
        """(sha256, chunk IDs) of ``rel`` if it was stored with exactly this stat."""
        row = self.row(
            "SELECT size, mtime, ctime, ino, sha, chunks FROM f WHERE repo=? AND path=?",
            (self.repo, rel),
        )
        if row is None or tuple(row[:4]) != self.key(st):
            return None
        ids = _ids(row[5])
        return (str(row[4]), ids) if ids or st.st_size == 0 else None

    def store_file(self, rel: str, st: os.stat_result, sha: str, chunks: list[str]) -> None:
        self.write(
            "INSERT OR REPLACE INTO f VALUES (?,?,?,?,?,?,?,?)",
            (self.repo, rel, *self.key(st), sha, json.dumps(chunks)),
        )

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
