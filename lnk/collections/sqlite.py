"""The SQLite driver: one database file, WAL mode, one connection per thread.

Every write is a ``BEGIN IMMEDIATE`` transaction, so writers (threads or
processes) take turns; an event is inserted only if its number is the current
last + 1, under that transaction and the (name, number) primary key.  A live
database is copied only with :meth:`SqliteStore.backup_to` (SQLite's online
backup API), never by copying its files.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sqlite3
import stat
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lnk.collections.base import (
    DEFAULT_LAPSE_MS,
    CollectionId,
    Event,
    Lease,
    Store,
    check_name,
    decode_value,
    encode_value,
    resolve_now,
)
from lnk.errors import InvalidInput

_PAGE = 500
_SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    kind TEXT NOT NULL, name TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (kind, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    name TEXT NOT NULL, number INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (name, number)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entries (
    kind TEXT NOT NULL, name TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (kind, name, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    name TEXT NOT NULL PRIMARY KEY, holder TEXT NOT NULL, taken_ms INTEGER NOT NULL,
    renewed_ms INTEGER NOT NULL, took_over INTEGER NOT NULL, previous_holder TEXT)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS staging (
    token TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (token, key)) WITHOUT ROWID;
"""


class SqliteStore(Store):
    """Collections in the SQLite database at ``path`` (created if missing)."""

    def __init__(
        self, path: Path, lapse_ms: int = DEFAULT_LAPSE_MS, busy_timeout_ms: int = 30_000
    ) -> None:
        super().__init__(lapse_ms)
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._pid = os.getpid()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._tx() as c:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    # ---- plumbing -----------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if os.getpid() != self._pid:  # forked: the parent's connections are not ours
            self._local = threading.local()
            self._all = []
            self._pid = os.getpid()
        c: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if c is None:
            was = self._no_link()
            c = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout_ms / 1000,
            )
            try:
                c.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
                c.execute("PRAGMA journal_mode = WAL")
                c.execute("PRAGMA synchronous = NORMAL")
                now = self._no_link()
                if was is not None and now != was:
                    raise InvalidInput(
                        f"{self.path} changed as it was opened",
                        hint=f"ls -l -- {shlex.quote(str(self.path))}",
                    )
            except BaseException:
                c.close()
                raise
            self._local.conn = c
            with self._all_lock:
                self._all.append(c)
        return c

    def _no_link(self) -> tuple[int, int] | None:
        """The database's device and inode (None: none yet), refused when it or a
        sidecar is a link: an agent writes the folder its store is in, and lnk opens
        that store outside the agent's sandbox (a move, a backup, its bridge), where a
        link would lead to another agent's store or any database of the machine's.
        (SQLite opens by path: checked before and after the open.)"""
        got = None
        for suffix in ("", "-wal", "-shm", "-journal"):
            p = f"{self.path}{suffix}"
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise InvalidInput(
                    f"{p} is a link, and lnk never opens an agent's store through one",
                    hint=f"rm -- {shlex.quote(p)}",
                )
            if not suffix:
                got = (st.st_dev, st.st_ino)
        return got

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local = threading.local()

    def backup_to(self, dest: Path) -> None:
        """Copy the whole database, consistently, while others keep writing."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = sqlite3.connect(dest)
        try:
            self._conn().backup(out)
        finally:
            out.close()

    @staticmethod
    def _register(c: sqlite3.Connection, cid: CollectionId, bump: int = 0) -> None:
        c.execute(
            "INSERT INTO collections (kind, name, version) VALUES (?, ?, ?) "
            "ON CONFLICT (kind, name) DO UPDATE SET version = version + excluded.version",
            (cid.kind, cid.name, bump),
        )

    def drop(self, cid: CollectionId) -> None:
        with self._tx() as c:
            if cid.shape == "log":
                c.execute("DELETE FROM events WHERE name = ?", (cid.name,))
                c.execute("DELETE FROM leases WHERE name = ?", (cid.name,))
            else:
                c.execute("DELETE FROM entries WHERE kind = ? AND name = ?", (cid.kind, cid.name))
            c.execute("DELETE FROM collections WHERE kind = ? AND name = ?", (cid.kind, cid.name))

    def _touch(self, cid: CollectionId) -> None:
        with self._tx() as c:
            self._register(c, cid)

    # ---- logs -------------------------------------------------------------
    def _append_encoded(self, cid: CollectionId, first: int, texts: list[str]) -> int:
        if not texts:
            return 0
        with self._tx() as c:
            if self._last(c, cid) != first - 1:
                return 0
            c.executemany(
                "INSERT INTO events (name, number, data) VALUES (?, ?, ?)",
                [(cid.name, first + i, t) for i, t in enumerate(texts)],
            )
            self._register(c, cid)
        return len(texts)

    @staticmethod
    def _last(c: sqlite3.Connection, cid: CollectionId) -> int:
        row = c.execute("SELECT max(number) FROM events WHERE name = ?", (cid.name,)).fetchone()
        return int(row[0] or 0)

    def iter_events(
        self, cid: CollectionId, start: int = 1, stop: int | None = None
    ) -> Iterator[Event]:
        self._log(cid)
        start, stop = self._range(start, stop)
        end = (1 << 62) if stop is None else stop
        n = start
        while n < end:
            rows = (
                self._conn()
                .execute(
                    "SELECT number, data FROM events WHERE name = ? AND number >= ? AND number < ? "
                    "ORDER BY number LIMIT ?",
                    (cid.name, n, end, _PAGE),
                )
                .fetchall()
            )
            for number, data in rows:
                yield Event(number, decode_value(data))
            if len(rows) < _PAGE:
                return
            n = rows[-1][0] + 1

    def last_number(self, cid: CollectionId) -> int:
        self._log(cid)
        return self._last(self._conn(), cid)

    # ---- maps -------------------------------------------------------------
    def put(self, cid: CollectionId, key: str, value: dict[str, Any]) -> None:
        self._map(cid)
        check_name("map key", key)
        text = encode_value(f"the value of {key!r}", value)
        with self._tx() as c:
            c.execute(
                "INSERT INTO entries (kind, name, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (kind, name, key) DO UPDATE SET value = excluded.value",
                (cid.kind, cid.name, key, text),
            )
            self._register(c, cid, 1)

    def get(self, cid: CollectionId, key: str) -> dict[str, Any] | None:
        self._map(cid)
        check_name("map key", key)
        row = (
            self._conn()
            .execute(
                "SELECT value FROM entries WHERE kind = ? AND name = ? AND key = ?",
                (cid.kind, cid.name, key),
            )
            .fetchone()
        )
        return None if row is None else decode_value(row[0])

    def delete(self, cid: CollectionId, key: str) -> bool:
        self._map(cid)
        check_name("map key", key)
        with self._tx() as c:
            cur = c.execute(
                "DELETE FROM entries WHERE kind = ? AND name = ? AND key = ?",
                (cid.kind, cid.name, key),
            )
            if cur.rowcount == 0:
                return False
            self._register(c, cid, 1)
        return True

    def items(self, cid: CollectionId) -> Iterator[tuple[str, dict[str, Any]]]:
        self._map(cid)
        after: str | None = None
        while True:
            if after is None:
                rows = (
                    self._conn()
                    .execute(
                        "SELECT key, value FROM entries WHERE kind = ? AND name = ? "
                        "ORDER BY key LIMIT ?",
                        (cid.kind, cid.name, _PAGE),
                    )
                    .fetchall()
                )
            else:
                rows = (
                    self._conn()
                    .execute(
                        "SELECT key, value FROM entries WHERE kind = ? AND name = ? AND key > ? "
                        "ORDER BY key LIMIT ?",
                        (cid.kind, cid.name, after, _PAGE),
                    )
                    .fetchall()
                )
            for key, value in rows:
                yield key, decode_value(value)
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    def _replace_map(self, cid: CollectionId, entries: Iterable[tuple[str, str]]) -> None:
        self._map(cid)
        token = uuid.uuid4().hex
        try:
            batch: list[tuple[str, str, str]] = []
            for key, text in entries:
                batch.append((token, key, text))
                if len(batch) >= _PAGE:
                    with self._tx() as c:
                        c.executemany("INSERT INTO staging VALUES (?, ?, ?)", batch)
                    batch = []
            with self._tx() as c:
                c.executemany("INSERT INTO staging VALUES (?, ?, ?)", batch)
                c.execute("DELETE FROM entries WHERE kind = ? AND name = ?", (cid.kind, cid.name))
                c.execute(
                    "INSERT INTO entries (kind, name, key, value) "
                    "SELECT ?, ?, key, value FROM staging WHERE token = ?",
                    (cid.kind, cid.name, token),
                )
                self._register(c, cid, 1)
        finally:
            with self._tx() as c:
                c.execute("DELETE FROM staging WHERE token = ?", (token,))

    # ---- both -------------------------------------------------------------
    def collections(self) -> list[CollectionId]:
        rows = self._conn().execute("SELECT kind, name FROM collections").fetchall()
        return sorted(CollectionId(k, n) for k, n in rows)

    def watermark(self, cid: CollectionId) -> int:
        if cid.shape == "log":
            return self.last_number(cid)
        row = (
            self._conn()
            .execute(
                "SELECT version FROM collections WHERE kind = ? AND name = ?", (cid.kind, cid.name)
            )
            .fetchone()
        )
        return 0 if row is None else int(row[0])

    # ---- the turn lease ---------------------------------------------------
    @staticmethod
    def _lease(c: sqlite3.Connection, cid: CollectionId) -> Lease | None:
        row = c.execute(
            "SELECT holder, taken_ms, renewed_ms, took_over, previous_holder "
            "FROM leases WHERE name = ?",
            (cid.name,),
        ).fetchone()
        if row is None:
            return None
        try:
            return Lease(row[0], int(row[1]), int(row[2]), bool(row[3]), row[4])
        except (TypeError, ValueError):
            raise InvalidInput(
                f"the turn lease of {cid.name} is malformed",
                hint="release it; the turn will be taken again",
            ) from None

    @staticmethod
    def _write_lease(c: sqlite3.Connection, cid: CollectionId, lease: Lease) -> None:
        c.execute(
            "INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?)",
            (
                cid.name,
                lease.holder,
                lease.taken_ms,
                lease.renewed_ms,
                int(lease.took_over),
                lease.previous_holder,
            ),
        )

    def read_lease(self, cid: CollectionId) -> Lease | None:
        return self._lease(self._conn(), self._log(cid))

    def take_lease(self, cid: CollectionId, holder: str, now_ms: int | None = None) -> Lease | None:
        self._log(cid)
        check_name("lease holder", holder)
        now = resolve_now(now_ms)
        with self._tx() as c:
            new = self._decide_take(self._lease(c, cid), holder, now)
            if new is not None:
                self._write_lease(c, cid, new)
        return new

    def renew_lease(self, cid: CollectionId, holder: str, now_ms: int | None = None) -> bool:
        self._log(cid)
        check_name("lease holder", holder)
        now = resolve_now(now_ms)
        with self._tx() as c:
            cur = self._lease(c, cid)
            if cur is None or cur.holder != holder:
                return False
            self._write_lease(
                c, cid, Lease(holder, cur.taken_ms, now, cur.took_over, cur.previous_holder)
            )
        return True

    def release_lease(self, cid: CollectionId, holder: str) -> bool:
        self._log(cid)
        check_name("lease holder", holder)
        with self._tx() as c:
            cur = self._lease(c, cid)
            if cur is None or cur.holder != holder:
                return False
            c.execute("DELETE FROM leases WHERE name = ?", (cid.name,))
        return True
