"""The caches beside an agent are best effort: a writer that finds another holding the
lock past a short wait drops what it would have written, and nothing fails."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from lnk.payload import cachedb
from lnk.payload.hashcache import HashCache


def test_a_cache_locked_by_another_writer_drops_rows_and_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cachedb, "BUSY_S", 0.05)
    path = tmp_path / "hashes.sqlite"
    f = tmp_path / "a.txt"
    f.write_bytes(b"a")
    st = os.stat(f)
    HashCache(path).close()  # made, empty
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer (a backup) holds the lock
    cache = HashCache(path)
    cache.store("Home/a.txt", st, "a" * 64)
    cache.store_folder("Home", b"fp", "d" * 64, 1)
    cache.close()  # the flush finds the lock held: dropped, no error
    other.execute("ROLLBACK")
    other.close()
    again = HashCache(path)
    try:
        assert again.lookup("Home/a.txt", st) is None
        assert again.folder("Home") is None
        again.store("Home/a.txt", st, "a" * 64)  # once free, written as usual
        again.store_folder("Home", b"fp", "d" * 64, 1)
    finally:
        again.close()
    last = HashCache(path, readonly=True)
    try:
        assert last.lookup("Home/a.txt", st) == "a" * 64
        assert last.folder("Home") == (b"fp", "d" * 64, 1)
    finally:
        last.close()


def test_a_new_cache_is_set_to_no_sync_before_it_is_switched_to_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Switched to WAL first, a new file is synced four times by SQLite, each sync waiting
    (on ext4) for every byte a receive wrote before it."""
    said: list[str] = []
    real = sqlite3.connect

    def connect(*args: Any, **kw: Any) -> Any:
        con = real(*args, **kw)
        con.set_trace_callback(said.append)
        return con

    monkeypatch.setattr(sqlite3, "connect", connect)
    HashCache(tmp_path / "hashes.sqlite").close()
    assert said.index("PRAGMA synchronous=OFF") < said.index("PRAGMA journal_mode=WAL")


def test_rows_held_are_seen_by_the_next_folders_query_before_any_commit(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(b"a")
    st = os.stat(f)
    path = tmp_path / "hashes.sqlite"
    cache = HashCache(path)
    cache.store("Home/x/a.txt", st, "a" * 64)  # its folder not asked yet: held, not written
    assert cache.lookup("Home/x/a.txt", st) == "a" * 64
    cache.close()
    again = HashCache(path, readonly=True)
    assert again.lookup("Home/x/a.txt", st) == "a" * 64  # committed at the close
    again.close()


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 499, 500, 501, 1234])
def test_insert_rows_puts_in_every_row_as_executemany_would(n: int) -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (i INT PRIMARY KEY, s TEXT, b BLOB)")
    rows = [(i, f"name {i}", bytes([i % 256])) for i in range(n)]
    cachedb.insert_rows(db, "INSERT INTO t", 3, iter(rows))  # any iterable, once
    assert db.execute("SELECT i, s, b FROM t ORDER BY i").fetchall() == rows


def test_insert_rows_keeps_within_the_connections_limit_of_values() -> None:
    db = sqlite3.connect(":memory:")
    db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 10)  # three rows of three a statement
    db.execute("CREATE TABLE t (a INT, b INT, c INT)")
    rows = [(i, i + 1, i + 2) for i in range(11)]
    cachedb.insert_rows(db, "INSERT INTO t", 3, rows)
    assert db.execute("SELECT a, b, c FROM t ORDER BY a").fetchall() == rows


def test_insert_rows_refuses_a_row_of_another_width_before_it_shifts_the_values() -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a INT, b INT)")
    with pytest.raises(ValueError, match="a row of 3 values for 2 columns"):
        cachedb.insert_rows(db, "INSERT INTO t", 2, [(1, 2), (3, 4, 5), (6, 7)])


def test_insert_rows_refused_leaves_the_refused_statements_rows_out() -> None:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute("CREATE TABLE t (i INT PRIMARY KEY)")
    rows = [(i,) for i in range(cachedb.ROWS_AT_ONCE)] + [(5,)]  # the 2nd statement's dup
    with pytest.raises(sqlite3.IntegrityError):
        cachedb.insert_rows(db, "INSERT INTO t", 1, rows)
    assert db.execute("SELECT COUNT(*) FROM t").fetchone()[0] == cachedb.ROWS_AT_ONCE
