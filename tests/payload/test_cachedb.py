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
