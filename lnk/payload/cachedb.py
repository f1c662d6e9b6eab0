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
    def __init__(self, path: Path | None, schema: tuple[str, ...]) -> None:
        self.db: sqlite3.Connection | None = None
        self.pending = 0
        if path is None:
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
        if self.db is None:
            return
        self.db.execute(sql, args)
        self.pending += 1
        if self.pending >= COMMIT_EVERY:
            self.db.execute("COMMIT")
            self.db.execute("BEGIN")
            self.pending = 0

    def close(self) -> None:
        if self.db is not None:
            self.db.execute("COMMIT")
            self.db.close()
            self.db = None
