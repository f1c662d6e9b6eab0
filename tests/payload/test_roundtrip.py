"""send | receive reproduces an agent exactly on a second machine."""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from payload_helpers import (
    EVENTS,
    agent_files,
    collections_of,
    fill_collections,
    link_groups,
    load_agent,
    make_agent,
    move,
    sample_agent,
    write,
)

from lnk.agents import grants
from lnk.agents.layout import Machine
from lnk.agents.stores import open_agent_store
from lnk.formats.stream import RECORD_MAX


def test_round_trip_reproduces_the_agent(src: Machine, dst: Machine) -> None:
    a = sample_agent(src)
    srep, rrep = move(a, dst)
    b = load_agent(dst)
    assert rrep.committed and rrep.id == a.id
    want = agent_files(a.folders.root)
    assert agent_files(b.folders.root) == want
    got = b.folders.home / "docs" / "report.txt"
    assert got.read_bytes() == b"the report\n"
    assert stat.S_IMODE(got.stat().st_mode) == 0o640
    assert got.stat().st_mtime_ns == 1_600_000_000_123_456_789
    assert os.stat(b.folders.home / "run.sh").st_mode & 0o777 == 0o755
    # the hard link arrives as a hard link
    assert got.stat().st_ino == (b.folders.home / "report-link.txt").stat().st_ino
    assert link_groups(b.folders.root) == {
        frozenset({"Home/docs/report.txt", "Home/report-link.txt"})
    }
    # the symlink is carried as a link (its target text), never followed
    assert os.readlink(b.folders.home / "passwd") == "/etc/passwd"
    assert srep.links == 1 and srep.skipped_links == 0
    # the hard link's bytes travelled once
    assert srep.data_bytes == len(b"the report\n") + len(b"#!/bin/sh\necho hi\n") + len(
        b"water is wet\n"
    )
    # collections, settings and grants
    assert collections_of(b) == collections_of(a)
    assert len(collections_of(b)) == 4
    for field in ("id", "owner", "name", "store", "harness", "sandbox"):
        assert getattr(b.settings, field) == getattr(a.settings, field)
    assert grants.parse(b.folders.sandbox_toml.read_text()) == grants.parse(
        a.folders.sandbox_toml.read_text()
    )
    # the receiver is gone: its key with it
    assert not any(dst.receivers_dir.iterdir())


def test_round_trip_across_store_drivers(src: Machine, dst: Machine, tmp_path: Path) -> None:
    a = sample_agent(src, store="sqlite")
    assert (a.folders.chats / "store.sqlite").exists()
    move(a, dst, store="files")
    b = load_agent(dst)
    assert b.settings.store == "files"
    assert not (b.folders.chats / "store.sqlite").exists()
    assert collections_of(b) == collections_of(a)
    # and back again, into sqlite on a third machine
    c_machine = Machine(tmp_path / "c")
    move(b, c_machine, store="sqlite")
    c = load_agent(c_machine)
    assert c.settings.store == "sqlite"
    assert (c.folders.chats / "store.sqlite").exists()
    assert collections_of(c) == collections_of(a)


def test_store_driver_defaults_to_the_senders(src: Machine, dst: Machine) -> None:
    a = sample_agent(src, store="sqlite")
    move(a, dst)
    b = load_agent(dst)
    assert b.settings.store == "sqlite"
    assert collections_of(b) == collections_of(a)


def test_live_sqlite_database_arrives_complete(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    db = a.folders.agent / "memory" / "index.sqlite"
    con = sqlite3.connect(db, isolation_level=None)
    try:
        assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        con.execute("PRAGMA wal_autocheckpoint=0")
        con.execute("CREATE TABLE t (i INTEGER, v TEXT)")
        con.executemany("INSERT INTO t VALUES (?, ?)", ((i, "x" * 50) for i in range(2000)))
        # the rows live only in the WAL while this connection stays open
        assert Path(str(db) + "-wal").stat().st_size > 0
        srep, _ = move(a, dst)
    finally:
        con.close()
    got = load_agent(dst).folders.agent / "memory" / "index.sqlite"
    assert not Path(str(got) + "-wal").exists() or Path(str(got) + "-wal").stat().st_size == 0
    check = sqlite3.connect(got)
    try:
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert check.execute("SELECT COUNT(*), SUM(i) FROM t").fetchone() == (2000, 1999 * 1000)
    finally:
        check.close()
    assert srep.files == 1  # the -wal and -shm sidecars are folded into the snapshot


def test_duplicate_content_travels_once(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    blob = os.urandom(300_000)
    write(a.folders.home / "one.bin", blob)
    write(a.folders.home / "two.bin", blob)
    write(a.folders.agent / "skills" / "three.bin", blob)
    srep, _ = move(a, dst)
    assert srep.data_bytes == len(blob)
    b = load_agent(dst)
    for p in ("Home/one.bin", "Home/two.bin", "Agent/skills/three.bin"):
        assert (b.folders.root / p).read_bytes() == blob
    assert link_groups(b.folders.root) == set()  # equal content is not made a hard link


# ---- the property ---------------------------------------------------------------------
SIZES = st.sampled_from([0, 1, 17, 4096, RECORD_MAX - 1, RECORD_MAX, RECORD_MAX + 1])
NAMES = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789._- éß漢", min_size=1, max_size=12
).filter(lambda s: s not in (".", "..") and not s.startswith("-"))
FILE = st.tuples(
    SIZES,
    st.integers(0, 0o77),
    st.booleans(),
    st.integers(0, 2_000_000_000 * 10**9),
    st.integers(0, 2**32),
)
TREE = st.recursive(
    st.dictionaries(NAMES, FILE, max_size=4),
    lambda inner: st.dictionaries(NAMES, st.one_of(FILE, inner), max_size=3),
    max_leaves=8,
)
ROOTS = st.sampled_from(
    ["Home", "Agent/memory", "Agent/skills", "Agent/instructions", "Agent/schedule"]
)


def _build(root: Path, spec: dict, files: list[Path]) -> None:
    for name, v in spec.items():
        p = root / name
        if isinstance(v, dict):
            if p.exists() and not p.is_dir():
                continue  # an earlier tree made a file of that name
            p.mkdir(exist_ok=True)
            _build(p, v, files)
            os.chmod(p, 0o700 | (sum(map(ord, name)) & 0o55))
        elif not p.exists():
            size, perm, ex, mtime, seed = v
            write(
                p, random.Random(seed).randbytes(size), 0o600 | perm | (0o100 if ex else 0), mtime
            )
            files.append(p)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    trees=st.lists(st.tuples(ROOTS, TREE), min_size=1, max_size=3),
    links=st.lists(st.tuples(st.integers(0, 50), NAMES), max_size=3),
    events=st.lists(
        st.dictionaries(
            st.sampled_from(["role", "text", "n"]), st.one_of(st.text(max_size=30), st.integers())
        ),
        max_size=6,
    ),
    notes=st.dictionaries(NAMES, st.dictionaries(st.just("v"), st.text(max_size=20)), max_size=3),
    store=st.sampled_from(["files", "sqlite"]),
)
def test_property_exact_reproduction(
    trees: list, links: list, events: list, notes: dict, store: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Machine(Path(tmp) / "a"), Machine(Path(tmp) / "b")
        a = make_agent(src, store=store)
        files: list[Path] = []
        for root, spec in trees:
            _build(a.folders.root / root, spec, files)
        for i, (which, name) in enumerate(links):
            if files:
                target = files[which % len(files)]
                link = target.parent / f"link{i}-{name}"
                if not link.exists():
                    os.link(target, link)
        s = open_agent_store(a.folders.chats, store)
        try:
            for n, ev in enumerate(events, 1):
                assert s.append(EVENTS, n, ev)
        finally:
            s.close()
        if notes:
            fill_collections(a, events=0, notes=notes)
        move(a, dst)
        b = load_agent(dst)
        assert agent_files(b.folders.root) == agent_files(a.folders.root)
        assert link_groups(b.folders.root) == link_groups(a.folders.root)
        assert collections_of(b) == collections_of(a)
        assert b.settings.store == store
