"""Folder digests from stats and the hash cache's folder memory (lnk/payload/digests.py):
always the digests a walk with ends computes, cold or remembered, and a change of any
kind under a folder changes what it reports."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lnk.payload import digests as D
from lnk.payload.digests import index_tree, regular_files, tree_digests
from lnk.payload.hashcache import HashCache
from lnk.payload.local_index import RowsFromCache
from lnk.payload.walk import WalkStats, walk_agent

OLD_NS = 1_600_000_000 * 10**9


def walked(root: Path, cache: HashCache) -> tuple[dict[str, str], dict[str, int]]:
    """The oracle: a send's walk with ends (nothing hashed, links carried, no snapshot)."""
    digests: dict[str, str] = {}
    counts: dict[str, int] = {}
    stack: list[int] = []
    for f in walk_agent(
        root, cache, WalkStats(), None, hash_files=False, links=True, sqlite=False, ends=True
    ):
        if f.kind == "d":
            stack.append(0)
        elif f.kind == "f":
            stack[-1] += 1
        elif f.kind == "e":
            n = stack.pop()
            if stack:
                stack[-1] += n
            counts[f.rel] = n
            if f.sha256:
                digests[f.rel] = f.sha256
    return digests, counts


def hash_all(root: Path, cache: HashCache) -> None:
    for _ in walk_agent(root, cache, WalkStats(), None, links=True, sqlite=False):
        pass


class Lookups(HashCache):
    """A hash cache that counts the file rows asked for."""

    asked = 0

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        self.asked += 1
        return super().lookup(rel, st)


@pytest.fixture
def not_racy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing counts as changed within the clock's step (files written by the test
    have a ctime of now, so otherwise no folder is ever remembered)."""
    monkeypatch.setattr(D, "RACY_NS", -(10**18))


def write(p: Path, data: bytes, mode: int = 0o644) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    os.chmod(p, mode)
    os.utime(p, ns=(OLD_NS, OLD_NS))


def tree(root: Path) -> None:
    write(root / "Home" / "a.txt", b"hello\n")
    write(root / "Home" / "empty", b"")
    write(root / "Home" / "notes" / "n1.md", b"one")
    write(root / "Home" / "notes" / "deep" / "x" / "y.bin", b"\x00" * 100, 0o600)
    os.symlink("../a.txt", root / "Home" / "notes" / "link")
    write(root / "Agent" / "memory" / "m.json", b"{}")
    write(root / "Agent" / "skills" / "s.md", b"skill")


Entry = tuple[str, str, int]  # (kind, path, variant)

names = st.sampled_from(["a", "b", "c.db", "c.db-wal", "d.db-shm", "é", "sub", "x y"])
entries = st.lists(
    st.tuples(
        st.sampled_from(
            ["file", "file", "file", "empty", "link", "dead", "fifo", "hard", "dir", "db"]
        ),
        st.lists(names, min_size=1, max_size=3).map("/".join),
        st.integers(0, 3),
    ),
    max_size=14,
)


def build(root: Path, spec: list[Entry]) -> None:
    (root / "Home").mkdir(parents=True)
    for kind, rel, v in spec:
        p = root / "Home" / rel
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(p):
                continue
            if kind == "file":
                write(p, bytes([v]) * (v + 1), 0o644 if v % 2 else 0o600)
            elif kind == "empty":
                write(p, b"")
            elif kind == "link":
                os.symlink(f"target-{v}", p)
            elif kind == "dead":
                os.symlink("/nonexistent/" + "z" * v, p)
            elif kind == "fifo":
                os.mkfifo(p)
            elif kind == "db":
                con = sqlite3.connect(p)
                con.execute("CREATE TABLE t (v)")
                con.execute("INSERT INTO t VALUES (?)", (v,))
                con.commit()
                con.close()
            elif kind == "hard":
                write(p, b"hard")
                os.link(p, p.with_name(p.name + ".h"))
            else:
                p.mkdir()
                os.chmod(p, 0o755 if v % 2 else 0o700)
        except (FileExistsError, NotADirectoryError, sqlite3.Error):
            continue  # a name taken by another kind of entry on the way


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=entries, hashed=st.booleans())
def test_the_same_digests_as_a_walk_cold_and_remembered(
    tmp_path_factory: pytest.TempPathFactory, spec: list[Entry], hashed: bool
) -> None:
    root = tmp_path_factory.mktemp("agent")
    build(root, spec)
    cache = HashCache(root.parent / f"{root.name}.sqlite")
    try:
        if hashed:
            hash_all(root, cache)
        want = walked(root, cache)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(D, "RACY_NS", -(10**18))
            assert tree_digests(root, cache) == want  # cold: computed, and remembered
            assert tree_digests(root, cache) == want  # remembered
    finally:
        cache.close()


def test_an_unchanged_tree_reads_no_file_row(tmp_path: Path, not_racy: None) -> None:
    root = tmp_path / "agent"
    tree(root)
    cache = Lookups(tmp_path / "h.sqlite")
    hash_all(root, cache)
    want = walked(root, cache)
    assert want[0]["Home"]
    assert tree_digests(root, cache) == want  # computed once, and remembered
    cache.asked = 0
    assert tree_digests(root, cache) == want
    assert cache.asked == 0


def test_nothing_is_remembered_while_a_change_may_hide_in_the_clock_step(
    tmp_path: Path,
) -> None:
    root = tmp_path / "agent"
    tree(root)  # every ctime is now
    cache = Lookups(tmp_path / "h.sqlite")
    hash_all(root, cache)
    want = walked(root, cache)
    cache.asked = 0
    assert tree_digests(root, cache) == want
    assert cache.asked == 6  # every file's row read again (the link has none)
    cache.close()
    # only the folder holding nothing but a folder is remembered (its part is a digest)
    con = sqlite3.connect(tmp_path / "h.sqlite")
    try:
        assert [r[0] for r in con.execute("SELECT dir FROM dg")] == ["Home/notes/deep"]
    finally:
        con.close()


@pytest.mark.parametrize(
    "row",
    [
        (b"?", "\x1b]0;pwned\x07" + "0" * 56, 3),  # not a digest: escapes in it
        (b"?", "A" * 64, 3),  # not lowercase hex
        (b"?", "0" * 64, -1),  # no count of files
        ("text", "0" * 64, 3),  # a fingerprint that is not bytes
        (b"?", 7, 3),
    ],
)
def test_a_remembered_folder_of_another_shape_is_no_word(
    tmp_path: Path, not_racy: None, row: tuple[object, object, object]
) -> None:
    """The cache is a file on disk: a row for a folder that is not (fingerprint bytes,
    64 lowercase hex digits, files >= 0) is ignored, and the folder is read."""
    root = tmp_path / "agent"
    tree(root)
    path = tmp_path / "h.sqlite"
    cache = HashCache(path)
    hash_all(root, cache)
    want = tree_digests(root, cache)
    cache.close()
    con = sqlite3.connect(path)
    fp = con.execute("SELECT fp FROM dg WHERE dir='Home/notes'").fetchone()[0]
    fp_, digest, files = row
    con.execute(
        "UPDATE dg SET fp=?, digest=?, files=? WHERE dir='Home/notes'",
        (fp if fp_ == b"?" else fp_, digest, files),
    )
    con.commit()
    con.close()
    ro = Lookups(path, readonly=True)
    try:
        assert ro.folder("Home/notes") is None
        assert tree_digests(root, ro) == want
        assert ro.asked == 1  # its one file (n1.md) looked up again; the rest remembered
    finally:
        ro.close()


@pytest.mark.parametrize(
    "change",
    [
        "same size and mtime",
        "mode",
        "renamed",
        "removed",
        "added",
        "link swapped",
        "hard link",
        "sidecar",
        "deep folder",
        "folder mode",
    ],
)
def test_a_change_of_any_kind_shows(tmp_path: Path, not_racy: None, change: str) -> None:
    root = tmp_path / "agent"
    tree(root)
    cache = HashCache(tmp_path / "h.sqlite")
    hash_all(root, cache)
    before = tree_digests(root, cache)
    assert tree_digests(root, cache) == before
    home = root / "Home"
    if change == "same size and mtime":
        write(home / "a.txt", b"HELLO\n")  # a new ctime only
    elif change == "mode":
        os.chmod(home / "a.txt", 0o600)
    elif change == "renamed":
        os.rename(home / "a.txt", home / "b.txt")
    elif change == "removed":
        os.unlink(home / "empty")
    elif change == "added":
        write(home / "new", b"")
    elif change == "link swapped":
        os.unlink(home / "notes" / "link")
        os.symlink("elsewhere", home / "notes" / "link")
    elif change == "hard link":
        os.link(home / "a.txt", tmp_path / "outside")
    elif change == "sidecar":
        write(home / "a.txt-wal", b"")
    elif change == "deep folder":
        write(home / "notes" / "deep" / "x" / "y.bin", b"\x01" * 100, 0o600)
    else:
        os.chmod(home / "notes" / "deep", 0o711)
    hash_all(root, cache)
    after = tree_digests(root, cache)
    assert after == walked(root, cache)
    assert after[0].get("Home") != before[0]["Home"]
    assert after[0]["Agent/memory"] == before[0]["Agent/memory"]


def test_a_folder_remembered_by_a_read_only_cache_is_not_written(
    tmp_path: Path, not_racy: None
) -> None:
    root = tmp_path / "agent"
    tree(root)
    path = tmp_path / "h.sqlite"
    cache = HashCache(path)
    hash_all(root, cache)
    cache.close()
    ro = Lookups(path, readonly=True)
    want = walked(root, ro)
    assert tree_digests(root, ro) == want
    assert ro.asked > 0  # the walk above could not remember anything
    ro.close()
    con = sqlite3.connect(path)
    try:
        assert con.execute("SELECT COUNT(*) FROM dg").fetchone()[0] == 0
    finally:
        con.close()


Index = tuple[list[tuple[str, str, str]], dict[str, str]]


def walked_index(root: Path, cache: HashCache, snap: Path) -> Index:
    """The oracle of a receiver's index: a walk with ends hashing what it must."""
    rows: list[tuple[str, str, str]] = []
    digests: dict[str, str] = {}
    for f in walk_agent(root, cache, WalkStats(), snap, links=True, ends=True):
        if f.kind == "f" and f.source is not None:
            rows.append((f.sha256, "" if f.snapshot else str(f.source), f.rel))
        elif f.kind == "e" and f.sha256:
            digests[f.rel] = f.sha256
    return sorted(rows), digests


def indexed(root: Path, cache_path: Path, snap: Path, cache: HashCache | None = None) -> Index:
    """A receiver's index of ``root`` as a prepare makes it (``index_local``'s calls): the
    cache at ``cache_path`` opened for it (or ``cache``, on that file) and closed after, as
    each prepare's is; the rows of the folders it remembers taken in SQL (``RowsFromCache``)."""
    rows: list[tuple[str, str, str]] = []

    def note(files: list[tuple[str, str, str]]) -> None:
        for sha, source, rel in files:
            rows.append((sha, "" if source.startswith(str(snap)) else source, rel))

    cache = cache or HashCache(cache_path)
    con = sqlite3.connect(":memory:")
    try:
        con.execute("CREATE TABLE c (sha TEXT, path TEXT, rel TEXT)")
        con.execute("ATTACH DATABASE ? AS k", (str(cache_path),))
        con.execute("BEGIN")
        digests = index_tree(root, cache, snap, note, RowsFromCache(con))[0]
        indexed.from_cache = con.execute("SELECT COUNT(*) FROM c").fetchone()[0]
        rows.extend(con.execute("SELECT sha, path, rel FROM c"))
    finally:
        con.close()
        cache.close()
    return sorted(rows), digests


indexed.from_cache = 0  # how many files the last index took from the cache's rows in SQL


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=entries)
def test_a_receivers_index_is_the_walks_cold_and_remembered(
    tmp_path_factory: pytest.TempPathFactory, spec: list[Entry]
) -> None:
    root = tmp_path_factory.mktemp("agent")
    build(root, spec)
    snap = root.parent / f"{root.name}-snap"
    snap.mkdir()
    cache = HashCache(root.parent / f"{root.name}-1.sqlite")
    try:
        want = walked_index(root, cache, snap)
    finally:
        cache.close()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(D, "RACY_NS", -(10**18))
        path = root.parent / f"{root.name}-2.sqlite"
        assert indexed(root, path, snap) == want  # cold: hashes, remembers
        assert indexed.from_cache == 0
        assert indexed(root, path, snap) == want  # from the remembered folders


def test_an_index_from_remembered_folders_hashes_nothing(tmp_path: Path, not_racy: None) -> None:
    root = tmp_path / "agent"
    tree(root)
    write(root / "Home" / "two" / "p.txt", b"p")
    write(root / "Home" / "two" / "q.txt", b"q")
    path = tmp_path / "h.sqlite"
    snap = tmp_path / "snap"
    snap.mkdir()
    want = indexed(root, path, snap)
    assert indexed.from_cache == 0
    cache = Lookups(path)
    assert indexed(root, path, snap, cache) == want
    assert cache.asked == 0  # no lookup through the cache's own rule (a kept folder's notes)
    assert len(want[0]) == 8 and want[1]["Home"]
    assert indexed.from_cache == 7  # all but the empty file, which needs no row
    # a row gone from the cache: its folder is read again, none of its rows half taken
    con = sqlite3.connect(path)
    con.execute("DELETE FROM h2 WHERE dir = 'Home/two' AND name = 'q.txt'")
    con.commit()
    con.close()
    cache = Lookups(path)
    assert indexed(root, path, snap, cache) == want
    assert cache.asked == 2 and indexed.from_cache == 5


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=entries)
def test_the_regular_files_are_the_walks(
    tmp_path_factory: pytest.TempPathFactory, spec: list[Entry]
) -> None:
    """What a kept folder's left stats note (kept.record_left): each file the walk of a
    move back's prepare looks at, with its stat."""
    root = tmp_path_factory.mktemp("agent")
    build(root, spec)
    want = sorted(
        (f.rel, f.st.st_ino)
        for f in walk_agent(
            root, HashCache(None), WalkStats(), None, hash_files=False, sqlite=False
        )
        if f.kind == "f" and f.st is not None
    )
    assert sorted((rel, st.st_ino) for rel, st in regular_files(root)) == want


def test_rows_from_a_cache_without_them_take_nothing(tmp_path: Path) -> None:
    """A cache file without its rows' table (or one that can't be read): the folder is
    read instead (False), nothing is taken, and the index's transaction goes on."""
    sqlite3.connect(tmp_path / "other.sqlite").execute("CREATE TABLE t (x)").connection.close()
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE c (sha TEXT, path TEXT, rel TEXT)")
    con.execute("ATTACH DATABASE ? AS k", (str(tmp_path / "other.sqlite"),))
    con.execute("BEGIN")
    rows = RowsFromCache(con)
    assert rows("Home", "/x/Home", ["a.txt"]) is False
    assert rows("Home", "/x/Home", []) is True  # nothing to take
    con.execute("INSERT INTO c VALUES ('s', 'p', 'r')")
    con.commit()
    assert con.execute("SELECT rel FROM c").fetchall() == [("r",)]


def test_a_tampered_cache_with_two_rows_for_one_name_takes_nothing(tmp_path: Path) -> None:
    """The kept folder's cache lies in a person's folder: one whose table has no key, two
    rows for one file and none for its neighbour, must not pass for a row a name (the
    folder is read instead, its files hashed)."""
    db = tmp_path / "tampered.sqlite"
    con = sqlite3.connect(db)
    con.execute(
        "CREATE TABLE h2 (dir TEXT, name TEXT, size INT, mtime INT, ctime INT, ino INT, sha TEXT)"
    )
    con.executemany(
        "INSERT INTO h2 VALUES ('Home', 'a.txt', 1, 1, 1, 1, ?)", [("ab" * 32,), ("cd" * 32,)]
    )
    con.commit()
    con.close()
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE c (sha TEXT, path TEXT, rel TEXT)")
    con.execute("ATTACH DATABASE ? AS k", (str(db),))
    con.execute("BEGIN")
    assert RowsFromCache(con)("Home", "/x/Home", ["a.txt", "b.txt"]) is False
    assert con.execute("SELECT COUNT(*) FROM c").fetchone()[0] == 0
    # one row a name, though two are there: taken once
    assert RowsFromCache(con)("Home", "/x/Home", ["a.txt"]) is True
    assert con.execute("SELECT rel FROM c").fetchall() == [("Home/a.txt",)]


def _cache_with(db: Path, names: list[str]) -> None:
    """lnk's own hash cache, one row for each of ``names`` in ``Home``."""
    cache = HashCache(db)
    for i, name in enumerate(names):
        cache.store(
            f"Home/{name}", os.stat_result((0o100644, i + 1, 0, 1, 0, 0, 5, 0, 0, 0)), f"{i:064x}"
        )
    cache.close()


def _index_con(cache: Path) -> sqlite3.Connection:
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE c (sha TEXT, path TEXT, rel TEXT)")
    con.execute("ATTACH DATABASE ? AS k", (str(cache),))
    con.execute("BEGIN")
    return con


def test_rows_from_lnks_own_cache_are_taken_without_grouping(tmp_path: Path) -> None:
    """The cache lnk made has its key (dir, name): one row a name, so the statement
    groups nothing, and takes each name's row."""
    _cache_with(tmp_path / "h.sqlite", ["a.txt", "b.txt"])
    con = _index_con(tmp_path / "h.sqlite")
    rows = RowsFromCache(con)
    assert "GROUP BY" not in rows.statement
    assert rows("Home", "/x/Home", ["a.txt", "b.txt"]) is True
    assert sorted(con.execute("SELECT sha, rel FROM c")) == [
        (f"{0:064x}", "Home/a.txt"),
        (f"{1:064x}", "Home/b.txt"),
    ]
    assert rows("Home", "/x/Home", ["a.txt", "c.txt"]) is False  # a row missing: none


@pytest.mark.parametrize(
    "key", ["", ", PRIMARY KEY (name, dir)", ", PRIMARY KEY (dir)", ", PRIMARY KEY (name)"]
)
def test_a_cache_keyed_otherwise_is_grouped(tmp_path: Path, key: str) -> None:
    db = tmp_path / "other.sqlite"
    sqlite3.connect(db).execute(
        f"CREATE TABLE h2 (dir TEXT, name TEXT, size INT, mtime INT, ctime INT, ino INT, "
        f"sha TEXT{key})"
    ).connection.close()
    assert "GROUP BY name" in RowsFromCache(_index_con(db)).statement


def test_a_cache_swapped_during_the_index_is_not_seen_by_it(tmp_path: Path) -> None:
    """Its key is read inside the index's transaction, which reads one snapshot of the
    cache: a table put in its place meanwhile (without the key, two rows for one name)
    is not the one the statements read."""
    db = tmp_path / "h.sqlite"
    _cache_with(db, ["a.txt", "b.txt"])
    con = _index_con(db)
    rows = RowsFromCache(con)
    assert "GROUP BY" not in rows.statement
    other = sqlite3.connect(db, timeout=0)
    other.executescript(
        "BEGIN; DROP TABLE h2; CREATE TABLE h2 (dir TEXT, name TEXT, size INT, mtime INT, "
        "ctime INT, ino INT, sha TEXT); "
        f"INSERT INTO h2 VALUES ('Home', 'a.txt', 1, 1, 1, 1, '{'e' * 64}'); "
        f"INSERT INTO h2 VALUES ('Home', 'a.txt', 1, 1, 1, 1, '{'f' * 64}'); COMMIT;"
    )
    other.close()
    assert rows("Home", "/x/Home", ["a.txt", "b.txt"]) is True
    assert sorted(con.execute("SELECT sha FROM c")) == [(f"{0:064x}",), (f"{1:064x}",)]


@pytest.mark.parametrize(
    ("columns", "stored", "asked"),
    [
        # its key (dir, name) as lnk's, but names compared without case
        ("dir TEXT, name TEXT COLLATE NOCASE", "a.txt", "A.txt"),
        # a name column of numbers: "01" asked, the row of 1 matched
        ("dir TEXT, name INTEGER", "1", "01"),
        # a folder's column of numbers: folder "007" asked, the rows of folder 7 matched
        ("dir INTEGER, name TEXT", "a.txt", "a.txt"),
    ],
    ids=["nocase", "integer name", "integer dir"],
)
def test_a_cache_whose_rows_match_other_names_takes_none_of_them(
    tmp_path: Path, columns: str, stored: str, asked: str
) -> None:
    """A cache in a person's folder, with the key lnk gives its table but columns that
    compare loosely: a row matched for a name other than the one asked (another file's
    content, indexed under a path the folder may not even hold) is not taken."""
    db = tmp_path / "loose.sqlite"
    folder = "7" if columns.startswith("dir INTEGER") else "Home"
    asked_folder = "007" if folder == "7" else "Home"
    con0 = sqlite3.connect(db)
    con0.execute(
        f"CREATE TABLE h2 ({columns}, size INT, mtime INT, ctime INT, ino INT, sha TEXT, "
        "PRIMARY KEY (dir, name)) WITHOUT ROWID"
    )
    con0.execute("INSERT INTO h2 VALUES (?, ?, 1, 1, 1, 1, ?)", (folder, stored, "e" * 64))
    con0.commit()
    con0.close()
    con = _index_con(db)
    rows = RowsFromCache(con)
    assert "GROUP BY name" in rows.statement  # not lnk's own table: matched exactly
    assert rows(asked_folder, f"/x/{asked_folder}", [asked]) is False
    assert con.execute("SELECT rel FROM c").fetchall() == []
