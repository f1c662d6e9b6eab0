"""A small SQLite file that remembers what was read, written in batches.

Losing it only costs time (the next run reads again), so it is written without
fsync and committed every few thousand rows, and what another writer keeps
locked past a short wait (a backup beside a move's step) is dropped, not an
error.  The stream's SHA-256 cache and
the backup's chunk cache both sit on it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

COMMIT_EVERY = 2000
BUSY_S = 2.0  # how long a write waits for another writer's lock before it is dropped


ROWS_AT_ONCE = 500
"""Rows in one ``INSERT ... VALUES (...), (...)`` statement of :func:`insert_rows`."""


def insert_rows(
    db: sqlite3.Connection, head: str, width: int, rows: Iterable[Sequence[Any]]
) -> None:
    """``db.executemany(head + " VALUES (?,...)", rows)``, a few hundred rows a statement.

    ``executemany`` steps once a row, and each step lets go of the interpreter's lock
    and takes it back: beside a send's or a receive's busy threads, every row then
    waits its turn (100,000 cache rows: 1.2 s beside two reading threads, 0.1 s as
    here).  A statement is all or nothing: one refused leaves none of its rows in,
    and those of the statements before it in (the caller's transaction decides)."""
    limit = db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    at_once = max(1, min(ROWS_AT_ONCE, limit // width))
    batch: list[Any] = []
    n = 0
    for row in rows:
        if len(row) != width:
            raise ValueError(f"a row of {len(row)} values for {width} columns")
        batch.extend(row)
        n += 1
        if n == at_once:
            db.execute(_statement(head, width, n), batch)
            batch, n = [], 0
    # the rest in statements of 2**k rows: a few statements' texts, so the few the
    # connection keeps compiled serve every call (a statement of each length between
    # would compile anew, and its compiled program of a few hundred rows is kept)
    done = 0
    while n:
        k = 1 << (n.bit_length() - 1)
        db.execute(_statement(head, width, k), batch[done * width : (done + k) * width])
        done += k
        n -= k


def _statement(head: str, width: int, rows: int) -> str:
    one = "(" + ",".join("?" * width) + ")"
    return f"{head} VALUES {','.join([one] * rows)}"


class CacheDB:
    def __init__(self, path: Path | None, schema: tuple[str, ...], readonly: bool = False) -> None:
        self.db: sqlite3.Connection | None = None
        self.pending = 0
        self.drops = 0  # how many times uncommitted rows were dropped
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
        self.db = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=BUSY_S
        )
        # no fsync, first: a new file switched to WAL would otherwise sync it four times,
        # each waiting (ext4's ordered journal) for every byte a receive wrote before
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("PRAGMA journal_mode=WAL")
        for statement in schema:
            self.db.execute(statement)
        self.db.execute("BEGIN")

    def row(self, sql: str, args: tuple[Any, ...]) -> Any:
        return None if self.db is None else self.db.execute(sql, args).fetchone()

    def write(self, sql: str, args: tuple[Any, ...]) -> None:
        if self.db is None or self.readonly:
            return
        try:
            self.db.execute(sql, args)
        except sqlite3.OperationalError:  # locked by another writer: this row is dropped
            self.drop()
            return
        self.pending += 1
        if self.pending >= COMMIT_EVERY:
            self.commit()

    def commit(self) -> None:
        """What is written so far, committed (or dropped if another writer holds the lock)."""
        if self.db is None or self.readonly:
            return
        try:
            self.db.execute("COMMIT")
        except sqlite3.OperationalError:
            self.drop()
            return
        self.db.execute("BEGIN")
        self.pending = 0

    def drop(self) -> None:
        """Forget what this run wrote and is not committed: the next run reads it again."""
        assert self.db is not None
        self.drops += 1
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")
        self.db.execute("BEGIN")
        self.pending = 0

    def close(self) -> None:
        if self.db is not None:
            if not self.readonly:
                try:
                    self.db.execute("COMMIT")
                except sqlite3.OperationalError:  # locked by another writer: dropped
                    if self.db.in_transaction:
                        self.db.execute("ROLLBACK")
            self.db.close()
            self.db = None
