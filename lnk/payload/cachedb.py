"""A small SQLite file that remembers what was read, written in batches.

Losing it only costs time (the next run reads again), so it is written without
fsync and committed every few thousand rows.  The stream's SHA-256 cache and
the backup's chunk cache both sit on it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

COMMIT_EVERY = 2000


class CacheDB:
    def __init__(self, path: Path | None, schema: tuple[str, ...], readonly: bool = False) -> None:
        self.db: sqlite3.Connection | None = None
        self.pending = 0
        self.readonly = readonly
        if path is None:
            return
        if readonly:  # read as it is, nothing written beside it (no -wal, no -shm)
            if path.is_file():
                self.db = sqlite3.connect(
                    f"file:{path}?immutable=1",
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                )
            return
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")
        for statement in schema:
            self.db.execute(statement)
        self.db.execute("BEGIN")

    def row(self, sql: str, args: tuple[Any, ...]) -> Any:
        return None if self.db is None else self.db.execute(sql, args).fetchone()

    def write(self, sql: str, args: tuple[Any, ...]) -> None:
        if self.db is None or self.readonly:
            return
        self.db.execute(sql, args)
        self.pending += 1
        if self.pending >= COMMIT_EVERY:
            self.db.execute("COMMIT")
            self.db.execute("BEGIN")
            self.pending = 0

    def close(self) -> None:
        if self.db is not None:
            if not self.readonly:
                self.db.execute("COMMIT")
            self.db.close()
            self.db = None
