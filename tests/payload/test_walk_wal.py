"""A SQLite database whose commits sit in its write-ahead log: its file's stat is the same
as when a cache last vouched for it, yet what it holds changed (Hermes's state.db after a
``hermes chat``, which leaves its log).  The walk reads it again, through SQLite."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from payload_helpers import load_agent, make_agent, move, write

from lnk.agents.layout import Machine
from lnk.payload.hashcache import HashCache
from lnk.payload.pinned import sha256_file
from lnk.payload.walk import SQLITE_MAGIC, WalkStats, walk_agent


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


def test_a_backup_reads_such_a_database_again(tmp_path: Path) -> None:
    """A backup too: a second backup after commits held in the log carries them, the file's
    stat unchanged (a database is stored through a snapshot each time, never vouched for by
    the chunk cache)."""
    from lnkrun import ok

    a, b, repo = tmp_path / "a", tmp_path / "b", tmp_path / "repo"
    for d in (a, b, repo):
        d.mkdir()
    ok("agent", "create", "work", home=a)
    db_path = a / "Link" / "Agents" / "work" / "Home" / "notes.db"
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("CREATE TABLE m (t TEXT)")
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    old = os.stat(db_path).st_mtime - 60  # read long after it changed: a cache remembers it
    os.utime(db_path, (old, old))
    to = ["--agent", "work", "--to", f"file://{repo}"]
    ok("agent", "backup", *to, home=a)
    st = os.stat(db_path)
    db.execute("INSERT INTO m VALUES ('after the first backup')")
    db.commit()
    assert os.stat(db_path).st_mtime_ns == st.st_mtime_ns
    ok("agent", "backup", *to, home=a)
    db.close()
    ok("backup", "key", "import", home=b, input=ok("backup", "key", "export", home=a).out)
    ok("agent", "restore", "work", "--from", f"file://{repo}", home=b)
    got = sqlite3.connect(b / "Link" / "Agents" / "work" / "Home" / "notes.db")
    assert got.execute("SELECT t FROM m").fetchall() == [("after the first backup",)]
    got.close()


def test_a_file_that_only_starts_like_a_database_travels_as_its_bytes(tmp_path: Path) -> None:
    """SQLite cannot read it (damaged past its header, or its -wal name taken by a
    folder): it goes as it is, in a move and in a second move's prepare, never a
    traceback (walk.sqlite_snapshot gives None)."""
    src, dst = Machine(tmp_path / "a"), Machine(tmp_path / "b")
    a = make_agent(src)
    garbage = SQLITE_MAGIC + b"\x00not a database" * 300
    write(a.folders.home / "bad.db", garbage)
    good = a.folders.home / "c.db"
    con = sqlite3.connect(good)
    con.execute("CREATE TABLE t (v)")
    con.commit()
    con.close()
    write(a.folders.home / "c.db-wal" / "a", b"a folder where the log would be\n")
    for _ in range(2):  # the second: the destination's prepare indexes them too
        srep, rep = move(a, dst, agent_id=a.id if _ else None, inventory=bool(_))
        assert rep.committed
        home = load_agent(dst).folders.home
        assert (home / "bad.db").read_bytes() == garbage
        assert (home / "c.db").read_bytes() == good.read_bytes()
        assert (home / "c.db-wal" / "a").read_bytes() == b"a folder where the log would be\n"
    assert srep.data_bytes == 0  # the second carried nothing: all held there
