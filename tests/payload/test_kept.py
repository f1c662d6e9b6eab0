"""A move back merges the folders the agent left here: nothing of the person's is lost."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

from payload_helpers import (
    agent_files,
    load_agent,
    move,
    prepare,
    receive_bytes,
    sample_agent,
    send_bytes,
    write,
)

from lnk.agents.layout import Machine
from lnk.move.moved import leave
from lnk.payload.kept import ChangeRecorder, record_left
from lnk.payload.receive import _take_cache
from lnk.payload.walk import WalkStats, walk_agent

OLD = 1_600_000_000_000_000_000


def test_a_move_back_keeps_what_a_person_added_or_changed_in_the_kept_folder(
    src: Machine, dst: Machine
) -> None:
    a = sample_agent(src)
    h = a.folders.home
    for name in ("mine.txt", "both.txt", "theirs.txt", "gone-there.txt"):
        write(h / name, f"{name} as it left\n".encode(), 0o644, OLD)
    write(h / "deep" / "er" / "x.txt", b"x\n", 0o644, OLD)
    move(a, dst)
    note = leave(src, a, "b")
    kept = Path(note["kept"]) / "Home"
    # a person works in the kept folder ...
    write(kept / "added.txt", b"added here\n")
    write(kept / "mine.txt", b"changed here only\n")
    write(kept / "both.txt", b"changed here\n")
    write(kept / "deep" / "er" / "new.txt", b"new in a folder the agent drops\n")
    # ... while the agent works at b
    b = load_agent(dst)
    bh = b.folders.home
    write(bh / "both.txt", b"changed there\n")
    write(bh / "theirs.txt", b"changed there only\n")
    (bh / "gone-there.txt").unlink()
    import shutil

    shutil.rmtree(bh / "deep")
    r = prepare(src, b.id)
    data, _ = send_bytes(b, r, inventory=r.inventory())
    rep = receive_bytes(src, r, data)
    assert rep.committed
    back = load_agent(src).folders.home
    assert (back / "added.txt").read_bytes() == b"added here\n"
    assert (back / "mine.txt").read_bytes() == b"changed here only\n"
    assert (back / "theirs.txt").read_bytes() == b"changed there only\n"
    assert (back / "both.txt").read_bytes() == b"changed there\n"
    assert (back / "deep" / "er" / "new.txt").read_bytes() == b"new in a folder the agent drops\n"
    assert not (back / "gone-there.txt").exists()  # the agent removed it; nobody changed it here
    assert not (back / "deep" / "er" / "x.txt").exists()
    [c] = rep.conflicts
    assert c["path"] == "Home/both.txt"
    assert re.fullmatch(r"Home/both\.txt\.moved-conflict-\d{8}", c["kept_as"])
    assert (back.parent / c["kept_as"]).read_bytes() == b"changed here\n"
    assert sorted(rep.kept_from_moved) == [
        "Home/added.txt",
        "Home/deep/er/new.txt",
        "Home/mine.txt",
    ]
    assert os.readlink(back / "passwd") == "/etc/passwd"  # a link survives the round trip
    assert not Path(note["kept"]).exists()  # every file found its place: the folder goes


def test_an_unchanged_round_trip_keeps_everything_and_reports_nothing(
    src: Machine, dst: Machine
) -> None:
    a = sample_agent(src)
    write(a.folders.home / "a.txt", b"a\n", 0o644, OLD)
    want = agent_files(a.folders.root)
    move(a, dst)
    leave(src, a, "b")
    b = load_agent(dst)
    r = prepare(src, b.id)
    data, srep = send_bytes(b, r, inventory=r.inventory())
    assert srep.data_bytes == 0  # the kept folder holds every byte
    rep = receive_bytes(src, r, data)
    assert rep.kept_from_moved == [] and rep.conflicts == []
    assert agent_files(load_agent(src).folders.root) == want


def test_a_move_back_after_last_moment_writes_and_a_database_keeps_no_copies(
    src: Machine, dst: Machine
) -> None:
    """Nobody touched the kept folder: a file the agent wrote in its last moments (its
    hash not cached, racy) and a SQLite database (never cached: it travels as a
    snapshot) are the agent's, not a person's: no conflict copies, nothing kept."""
    import sqlite3

    a = sample_agent(src)
    h = a.folders.home
    write(h / "old.txt", b"old\n", 0o644, OLD)
    con = sqlite3.connect(h / "state.db")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (v TEXT)")
    con.execute("INSERT INTO t VALUES ('before')")
    con.commit()
    con.close()
    write(h / "fresh.log", b"written just now\n")
    move(a, dst)
    leave(src, a, "b")
    b = load_agent(dst)
    write(b.folders.home / "fresh.log", b"the agent went on\n")
    con = sqlite3.connect(b.folders.home / "state.db")
    con.execute("INSERT INTO t VALUES ('after')")
    con.commit()
    con.close()
    r = prepare(src, b.id)
    data, _ = send_bytes(b, r, inventory=r.inventory())
    rep = receive_bytes(src, r, data)
    assert rep.committed
    assert rep.conflicts == [] and rep.kept_from_moved == []
    back = load_agent(src).folders.home
    assert (back / "fresh.log").read_bytes() == b"the agent went on\n"
    con = sqlite3.connect(back / "state.db")
    assert con.execute("SELECT v FROM t").fetchall() == [("before",), ("after",)]
    con.close()
    assert not [p for p in back.iterdir() if ".moved-conflict-" in p.name]


def test_the_left_stats_are_read_a_folder_at_a_time_and_tell_each_change(
    tmp_path: Path,
) -> None:
    """Names that sort around a folder's ``/`` (``a b``, ``a-x``, ``a.d``, ``a0``) are
    not taken for its files, and a change at any depth is told (kept.ChangeRecorder)."""
    kept = tmp_path / "kept"
    names = ["a/f", "a/sub/f", "a b/f", "a-x/f", "a.d/f", "a0/f", "f", "a/sub/deeper/f"]
    for n in names:
        write(kept / "Home" / n, n.encode(), 0o644, OLD)
    cache = kept / ".lnk-hashes.sqlite"
    record_left(kept, cache)
    write(kept / "Home" / "a-x" / "f", b"changed here\n", 0o644, OLD)
    write(kept / "Home" / "a" / "sub" / "new", b"added here\n", 0o644, OLD)
    rec = ChangeRecorder(cache)
    try:
        for _ in walk_agent(kept, rec, WalkStats(), None, hash_files=False, sqlite=False):
            pass
    finally:
        rec.close()
    assert sorted(rec.changed) == ["Home/a-x/f", "Home/a/sub/new"]


def _cache_with(path: Path, rows: list[str], keep_open: bool = False) -> sqlite3.Connection | None:
    """A hash cache file with a row for each name (in ``h2``) and a kept folder's note;
    with ``keep_open``, its connection is returned open (its write-ahead log beside it)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")  # (what is written stays in the log)
    con.execute(
        "CREATE TABLE IF NOT EXISTS h2 (dir TEXT, name TEXT, size INT, mtime INT, "
        "ctime INT, ino INT, sha TEXT, PRIMARY KEY (dir, name)) WITHOUT ROWID"
    )
    con.execute("CREATE TABLE IF NOT EXISTS left (rel TEXT PRIMARY KEY) WITHOUT ROWID")
    for name in rows:
        con.execute("INSERT INTO h2 VALUES ('Home', ?, 1, 1, 1, 1, ?)", (name, "ab" * 32))
    if keep_open:
        return con
    con.close()
    return None


def _names(path: Path) -> tuple[list[str], set[str]]:
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        names = [r[0] for r in con.execute("SELECT name FROM h2 ORDER BY name")]
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()
    return names, tables


def test_the_kept_folders_cache_becomes_the_agents(tmp_path: Path) -> None:
    """At a move back's commit the kept folder's cache is renamed into the agent's place
    (no copy in the pause), its notes dropped; a write-ahead log left beside it is read
    through SQLite (a copy), and a stale log at the agent's place is never taken for
    the cache's own."""
    (tmp_path / "kept").mkdir()
    src, dst = tmp_path / "kept" / ".lnk-hashes.sqlite", tmp_path / "rt" / "hashes.sqlite"
    _cache_with(src, ["a", "b"])
    # a stale log where the agent's cache goes: another database's frames
    dst.parent.mkdir()
    other = _cache_with(dst, ["x", "y", "z"], keep_open=True)
    assert other is not None
    stale = Path(f"{dst}-wal").read_bytes()
    assert stale
    other.close()
    Path(f"{dst}-wal").write_bytes(stale)
    _take_cache(src, dst)
    assert not src.exists()
    assert _names(dst) == (["a", "b"], {"h2"})
    # a log left beside the kept cache: what it holds comes along, through SQLite
    src2, dst2 = tmp_path / "kept" / "second.sqlite", tmp_path / "rt" / "second.sqlite"
    open_con = _cache_with(src2, ["c", "d", "e"], keep_open=True)
    assert open_con is not None
    try:
        assert Path(f"{src2}-wal").stat().st_size > 0
        _take_cache(src2, dst2)
    finally:
        open_con.close()
    assert _names(dst2) == (["c", "d", "e"], {"h2"})


def _journal_of(path: Path, rows: list[str]) -> bytes:
    """A rollback journal of the database at ``path`` (made with ``rows``): what a writer
    that stopped in the middle of a transaction leaves beside it."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("CREATE TABLE IF NOT EXISTS h2 (dir TEXT, name TEXT, sha TEXT)")
    for name in rows:
        con.execute("INSERT INTO h2 VALUES ('Home', ?, ?)", (name, "ab" * 32))
    con.execute("BEGIN")
    con.execute("DELETE FROM h2")
    journal = Path(f"{path}-journal").read_bytes()
    con.execute("ROLLBACK")
    con.close()
    assert journal
    return journal


def test_a_journal_beside_either_cache_is_never_taken_for_the_others(tmp_path: Path) -> None:
    """A rollback journal left at the agent's place (another database's) is removed, not
    rolled back into the kept cache renamed there; one left beside the kept cache is
    rolled back into it through SQLite (a copy), not left behind by a rename."""
    (tmp_path / "kept").mkdir()
    (tmp_path / "rt").mkdir()
    src, dst = tmp_path / "kept" / ".lnk-hashes.sqlite", tmp_path / "rt" / "hashes.sqlite"
    _cache_with(src, ["a", "b"])
    Path(f"{dst}-journal").write_bytes(_journal_of(dst, ["x", "y", "z"]))
    dst.unlink()  # (only its journal stays)
    _take_cache(src, dst)
    assert not src.exists() and not Path(f"{dst}-journal").exists()
    assert _names(dst)[0] == ["a", "b"]
    src2, dst2 = tmp_path / "kept" / "second.sqlite", tmp_path / "rt" / "second.sqlite"
    journal = _journal_of(src2, ["c", "d"])
    Path(f"{src2}-journal").write_bytes(journal)
    _take_cache(src2, dst2)
    assert src2.exists()  # copied, not renamed away from its journal
    assert _names(dst2)[0] == ["c", "d"]
