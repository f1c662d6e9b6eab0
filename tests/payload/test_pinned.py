"""An agent's folders changed under a walk and under the reads after it: nothing outside
the agent's folder is ever listed or read through a folder swapped for a link, from the
walk's listing to a send's bytes and a SQLite database's snapshot (lnk/payload/pinned.py).

The agent may do all of this from inside its sandbox, to have a file it cannot see
carried by a move or a backup it can then read back."""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from payload_helpers import load_agent, make_agent, prepare, receive_bytes, send_bytes, write
from swaps import SECRET, outside_with, swap_for_link, swapping_walk

from lnk.agents.layout import Machine
from lnk.payload import pinned as P
from lnk.payload import send as send_module
from lnk.payload import snapshots as S
from lnk.payload.digests import regular_files, tree_digests
from lnk.payload.hashcache import HashCache
from lnk.payload.walk import SQLITE_MAGIC, WalkStats, walk_agent


# ---- the walk ---------------------------------------------------------------------------
def test_a_folder_swapped_for_a_link_as_the_walk_reaches_it_is_not_listed(
    tmp_path: Path,
) -> None:
    """Swapped after the listing above saw a folder, before the walk goes into it (the
    ``keep`` question comes between the two): nothing of the link's target is walked."""
    root = tmp_path / "agent"
    for n in ("a.md", "b.md"):
        write(root / "Home" / "notes" / n, b"mine\n")
    write(root / "Home" / "z.md", b"after\n")
    out = outside_with(tmp_path, ["a.md", "b.md", "id_ed25519"])

    def keep(rel: str) -> str:
        if rel == "Home/notes":
            swap_for_link(root / "Home" / "notes", out)
        return ""

    cache = HashCache(tmp_path / "hashes.sqlite")
    walked = list(walk_agent(root, cache, WalkStats(), tmp_path / "snap", keep=keep, ends=True))
    rels = {f.rel for f in walked}
    assert not any(r.startswith("Home/notes/") for r in rels), rels
    assert "Home/z.md" in rels  # the rest of the walk goes on
    # the folder it could not enter has no digest, nor has anything above it
    ends = {f.rel: f.sha256 for f in walked if f.kind == "e"}
    assert ends["Home/notes"] == "" and ends["Home"] == ""


def test_the_folder_above_gone_while_walked_stops_there_never_elsewhere(
    tmp_path: Path,
) -> None:
    """The walk climbs back through ``..``, checked: a folder moved elsewhere while
    walked has another folder above it then, which is not taken for the one it left;
    found again from the root by name, that one is no longer the folder listed either,
    so nothing more of it is walked (a folder merely renamed is the same folder, and
    the walk goes on in it)."""
    root = tmp_path / "agent"
    h = root / "Home"
    write(h / "a" / "b" / "inner" / "deep.md", b"deep\n")
    write(h / "a" / "c" / "later.md", b"later\n")
    write(h / "x" / "other.md", b"other\n")
    moved = False

    def keep(rel: str) -> str:
        nonlocal moved
        if rel == "Home/a/b/inner" and not moved:  # the walk is in b
            moved = True
            os.rename(h / "a" / "b", h / "x" / "b")
            os.rename(h / "a", h / "a.old")
            (h / "a").mkdir()
        return ""

    cache = HashCache(tmp_path / "hashes.sqlite")
    walked = list(walk_agent(root, cache, WalkStats(), tmp_path / "s", ends=True, keep=keep))
    rels = [f.rel for f in walked]
    assert moved
    assert "Home/a/b/inner/deep.md" in rels  # listed through its own descriptor
    assert "Home/a/c/later.md" not in rels and "Home/a/c" not in rels
    assert "Home/x/other.md" in rels and "Home/x/b/inner/deep.md" in rels
    ends = {f.rel: f.sha256 for f in walked if f.kind == "e"}
    assert ends["Home/a"] == "" and ends["Home"] == ""


def test_a_folder_renamed_while_walked_is_walked_on_and_its_files_not_found(
    tmp_path: Path, src: Machine, dst: Machine
) -> None:
    """Renamed in the agent's folders while walked: the same folder, listed on; its
    files are not where the walk names them, so a read finds none (not sent)."""
    root = tmp_path / "agent"
    h = root / "Home"
    write(h / "a" / "b" / "deep.md", b"deep\n")
    write(h / "a" / "c" / "later.md", b"later\n")
    write(h / "x" / "keep.md", b"x\n")
    done = False

    def keep(rel: str) -> str:
        nonlocal done
        if rel == "Home/a/b" and not done:
            done = True
            os.rename(h / "a", h / "x" / "a")
        return ""

    cache = HashCache(tmp_path / "hashes.sqlite")
    walked = list(walk_agent(root, cache, WalkStats(), tmp_path / "s", keep=keep))
    later = [f for f in walked if f.rel == "Home/a/c/later.md"]
    assert done and len(later) == 1
    with pytest.raises(OSError) as e:
        P.open_walked(later[0].source or "", later[0].rel, later[0].st)
    assert e.value.errno == errno.ENOENT


def test_digests_and_regular_files_do_not_list_through_a_swapped_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "agent"
    write(root / "Home" / "notes" / "a.md", b"mine\n")
    out = outside_with(tmp_path, ["a.md", "secret.md"])
    real_down = P.Way.down

    def down(way: P.Way, name: str, st: os.stat_result) -> bool:
        notes = root / "Home" / "notes"
        if name == "notes" and notes.is_dir() and not notes.is_symlink():
            swap_for_link(notes, out)
        return real_down(way, name, st)

    monkeypatch.setattr(P.Way, "down", down)
    digests, _ = tree_digests(root, HashCache(tmp_path / "h.sqlite"))
    assert "Home/notes" not in digests and "Home" not in digests
    os.unlink(root / "Home" / "notes")
    os.rename(root / "Home" / "notes.was", root / "Home" / "notes")
    assert [r for r, _ in regular_files(root)] == []  # swapped again as it goes in


def test_a_tree_deeper_than_the_descriptors_a_process_may_hold_is_walked(
    tmp_path: Path,
) -> None:
    """One descriptor at a time, whatever the depth (the soft limit is often 1024, and a
    path of 4096 bytes may be 2048 folders deep)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    root = tmp_path / "agent"
    depth = 300
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.mkdir("agent", dir_fd=fd)
        for part in ["agent", "Home", *["d"] * depth]:
            if part != "agent":
                os.mkdir(part, dir_fd=fd)
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("leaf.md", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    # room for what this process holds already and a few more: far fewer than the depth
    limit = max(int(n) for n in os.listdir("/proc/self/fd")) + 32
    assert limit < depth
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        walked = list(walk_agent(root, HashCache(tmp_path / "h.sqlite"), WalkStats(), None,
                                 sqlite=False))  # fmt: skip
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    leaf = [f for f in walked if f.rel.endswith("/leaf.md")]
    assert len(leaf) == 1 and leaf[0].rel.count("/d") == depth


# ---- reading what the walk found ------------------------------------------------------------
def test_a_file_is_opened_as_the_walk_found_it_or_again_through_folders(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    f = write(root / "Home" / "notes" / "a.md", b"one\n")
    st = os.lstat(f)
    fd, now = P.open_walked(f, "Home/notes/a.md", st)
    os.close(fd)
    assert P.ident(now) == P.ident(st)
    # replaced since the walk (an editor's rename): the file there now, through folders
    write(root / "Home" / "notes" / "tmp", b"two\n")
    os.rename(root / "Home" / "notes" / "tmp", f)
    fd, now = P.open_walked(f, "Home/notes/a.md", st)
    try:
        assert os.read(fd, 10) == b"two\n" and P.ident(now) != P.ident(st)
    finally:
        os.close(fd)
    # a folder on its way swapped for a link: no file
    out = outside_with(tmp_path, ["a.md"])
    swap_for_link(root / "Home" / "notes", out)
    with pytest.raises(OSError) as e:
        P.open_walked(f, "Home/notes/a.md", st)
    assert e.value.errno in P.GONE
    # and a path that is not under its agent's folder is refused, not opened
    with pytest.raises(OSError) as e:
        P.open_walked(out / "a.md", "Home/notes/a.md", st)
    assert e.value.errno == errno.EINVAL


def test_a_send_never_carries_a_file_through_a_folder_swapped_after_the_walk(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The walk listed the folder; before its files are read it becomes a link to
    files of the same names outside.  They are not sent: the files of the folder's
    new place (none, through a link) are, so nothing of them arrives."""
    a = make_agent(src)
    h = a.folders.home
    for n in range(6):
        write(h / "notes" / f"n{n}.md", b"note %d\n" % n)
    write(h / "notes" / "big.bin", os.urandom(2 << 20))
    out = outside_with(tmp_path, [f"n{n}.md" for n in range(6)])
    write(out / "big.bin", SECRET * 100_000)
    walk, swapped = swapping_walk(send_module.walk_agent, "Home/notes/big.bin", h / "notes", out)
    monkeypatch.setattr(send_module, "walk_agent", walk)
    r = prepare(dst)
    data, rep = send_bytes(a, r, phase="bulk")
    assert swapped and SECRET not in data  # (sealed: checked again below, in the clear)
    monkeypatch.undo()
    receive_bytes(dst, r, data)
    for p in r.dir.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert SECRET not in p.read_bytes(), p
    # the agent, paused, as it is now: its notes are a link, carried as one
    final, _ = send_bytes(a, r, phase="final", since=rep.watermarks,
                          base_stream=rep.stream_id, inventory=r.inventory())  # fmt: skip
    assert receive_bytes(dst, r, final).committed
    got = load_agent(dst).folders.home
    assert (got / "notes").is_symlink() and (
        got / "notes.was" / "n3.md"
    ).read_bytes() == b"note 3\n"
    for p in got.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert SECRET not in p.read_bytes(), p


# ---- SQLite databases -----------------------------------------------------------------------
def make_db(path: Path, rows: list[str], wal: bool = False) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    if wal:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA wal_autocheckpoint=0")  # the commits stay in the log
    db.execute("CREATE TABLE m (t TEXT)")
    db.executemany("INSERT INTO m VALUES (?)", [(r,) for r in rows])
    db.commit()
    return db


def rows_of(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [r[0] for r in db.execute("SELECT t FROM m ORDER BY t")]
    finally:
        db.close()


def test_a_database_is_snapshotted_as_the_very_file_the_walk_found(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    db_path = root / "Agent" / "state" / "state.db"
    live = make_db(db_path, ["in the log"], wal=True)  # left open: its log stays
    try:
        st = os.lstat(db_path)
        into = tmp_path / "snaps"
        into.mkdir()
        snap = S.sqlite_snapshot(db_path, into, "Agent/state/state.db", st)
        assert snap is not None and rows_of(snap) == ["in the log"]  # through its log
        assert sorted(os.listdir(into)) == [snap.name]  # no pin left behind
        # its folder swapped for a link to another database of the same name
        out = tmp_path / "outside"
        make_db(out / "state.db", ["the machine's"]).close()
        swap_for_link(db_path.parent, out)
        assert S.sqlite_snapshot(db_path, into, "Agent/state/state.db", st) is None
    finally:
        live.close()


def test_a_sidecar_that_is_a_link_is_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "agent"
    db_path = root / "Agent" / "state.db"
    make_db(db_path, ["mine"]).close()
    # another database's log, offered as this one's
    other = tmp_path / "outside" / "other.db"
    keep = make_db(other, ["the machine's"], wal=True)
    try:
        os.symlink(Path(f"{other}-wal"), Path(f"{db_path}-wal"))
        into = tmp_path / "snaps"
        into.mkdir()
        snap = S.sqlite_snapshot(db_path, into, "Agent/state.db", os.lstat(db_path))
        assert snap is not None and rows_of(snap) == ["mine"]
    finally:
        keep.close()


def test_where_no_pin_can_be_made_the_path_is_checked_before_and_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot folder on another file system (a hard link cannot be made): the
    database is read by its path only while that leads to the file walked."""
    root = tmp_path / "agent"
    db_path = root / "Agent" / "s" / "state.db"
    make_db(db_path, ["mine"]).close()
    st = os.lstat(db_path)
    real_link = os.link

    def no_link(*args: Any, **kw: Any) -> None:
        raise OSError(errno.EXDEV, "another file system")

    monkeypatch.setattr(os, "link", no_link)
    into = tmp_path / "snaps"
    into.mkdir()
    snap = S.sqlite_snapshot(db_path, into, "Agent/s/state.db", st)
    assert snap is not None and rows_of(snap) == ["mine"]
    out = tmp_path / "outside"
    make_db(out / "state.db", ["the machine's"]).close()
    real_backup = S._backup

    def swapped_during(db: str | Path, into: Path) -> Path | None:
        swap_for_link(db_path.parent, out)  # as SQLite opens it
        return real_backup(db, into)

    monkeypatch.setattr(S, "_backup", swapped_during)
    assert S.sqlite_snapshot(db_path, into, "Agent/s/state.db", st) is None
    assert [p for p in into.iterdir() if p.name != snap.name] == []  # none kept
    monkeypatch.setattr(os, "link", real_link)


def test_a_log_made_beside_the_database_during_its_snapshot_voids_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that opened the database after its pin made a log SQLite did not read
    through the pin: the snapshot may miss its pages, so none is kept."""
    root = tmp_path / "agent"
    db_path = root / "Agent" / "state.db"
    make_db(db_path, ["mine"]).close()
    st = os.lstat(db_path)
    into = tmp_path / "snaps"
    into.mkdir()
    real_backup = S._backup

    def writer_arrives(db: str | Path, into: Path) -> Path | None:
        got = real_backup(db, into)
        write(Path(f"{db_path}-wal"), b"")
        return got

    monkeypatch.setattr(S, "_backup", writer_arrives)
    assert S.sqlite_snapshot(db_path, into, "Agent/state.db", st) is None
    assert list(into.iterdir()) == []


def test_a_hashing_walk_opens_each_file_once_and_still_tells_databases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first bytes say whether a file is a database, its rest is hashed, from one
    open; a database goes as its snapshot, and a file that only starts like one (SQLite
    cannot read it) as its bytes."""
    root = tmp_path / "agent"
    for n in range(5):
        write(root / "Home" / f"f{n}.txt", b"plain text, long enough %d\n" % n)
    make_db(root / "Home" / "state.db", ["mine"]).close()
    fake = write(root / "Home" / "fake.db", SQLITE_MAGIC + b"not a database at all" * 10)
    opened: list[str] = []
    real = P.open_file

    def spy(path: str | bytes | Path) -> int:
        opened.append(os.fsdecode(path))
        return real(path)

    (tmp_path / "snaps").mkdir()
    monkeypatch.setattr(P, "open_file", spy)
    walked = {
        f.rel: f
        for f in walk_agent(root, HashCache(None), WalkStats(), tmp_path / "snaps")
        if f.kind == "f"
    }
    for n in range(5):
        assert opened.count(str(root / "Home" / f"f{n}.txt")) == 1
        assert (
            walked[f"Home/f{n}.txt"].sha256
            == hashlib.sha256(b"plain text, long enough %d\n" % n).hexdigest()
        )
    assert walked["Home/state.db"].snapshot
    assert not walked["Home/fake.db"].snapshot
    assert walked["Home/fake.db"].sha256 == hashlib.sha256(fake.read_bytes()).hexdigest()
