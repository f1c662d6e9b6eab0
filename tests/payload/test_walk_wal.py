"""A SQLite database whose commits sit in its write-ahead log: its file's stat is the same
as when a cache last vouched for it, yet what it holds changed (Hermes's state.db after a
``hermes chat``, which leaves its log).  The walk reads it again, through SQLite."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from lnk.payload.hashcache import HashCache
from lnk.payload.walk import WalkStats, sha256_file, walk_agent


def test_a_database_with_a_log_beside_it_is_snapshotted_not_vouched_for(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    db_path = root / "Agent" / "harness" / "state.db"
    db_path.parent.mkdir(parents=True)
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")  # the commits stay in the log
    db.execute("CREATE TABLE m (t TEXT)")
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    cache = HashCache(tmp_path / "hashes.sqlite")
    st = os.stat(db_path)
    cache.store("Agent/harness/state.db", st, sha256_file(db_path))  # as a receiver would
    db.execute("INSERT INTO m VALUES ('said after the cache')")
    db.commit()
    assert os.stat(db_path).st_mtime_ns == st.st_mtime_ns  # the file itself: untouched
    assert (db_path.parent / "state.db-wal").stat().st_size > 0

    assert cache.lookup("Agent/harness/state.db", os.stat(db_path))  # it would vouch
    (tmp_path / "snaps").mkdir()
    walk = walk_agent(root, cache, WalkStats(), tmp_path / "snaps")
    walked = [f for f in walk if f.rel == "Agent/harness/state.db"]
    assert len(walked) == 1 and walked[0].snapshot
    snap = sqlite3.connect(walked[0].source)  # type: ignore[arg-type]
    assert snap.execute("SELECT t FROM m").fetchall() == [("said after the cache",)]
    snap.close()
    db.close()
