"""A first move's bulk kept as the receiver's base (lnk/payload/bulk_base.py): the final
names unchanged folders as held whole and the commit renames them, with the same agent
arriving as without; content the bulk could not settle is carried by the final; an
interrupted receiver's kept bulk is not sent again."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from payload_helpers import (
    agent_files,
    collections_of,
    dentry,
    fentry,
    fill_collections,
    head,
    load_agent,
    machine_tree,
    make_agent,
    payload,
    prepare,
    public,
    receive_bytes,
    roots,
    sample_agent,
    seal,
    send_bytes,
    sha,
    write,
)

from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.errors import StreamError
from lnk.payload.hashcache import HashCache
from lnk.payload.receivers import BULK_BASE

OLD = 1_600_000_000_000_000_000


def _agent(src: Machine) -> Agent:
    a = sample_agent(src)
    h = a.folders.home
    for d in ("proj/a", "proj/b", "notes"):
        for i in range(30):
            write(h / d / f"f{i}.txt", f"{d} {i}\n".encode() * 40, 0o644, OLD)
    write(h / "same-1.txt", b"twice\n", 0o644, OLD)  # one content, two files
    write(h / "same-2.txt", b"twice\n", 0o600, OLD)
    con = sqlite3.connect(h / "notes" / "state.db")
    con.execute("CREATE TABLE t (v)")
    con.execute("INSERT INTO t VALUES ('before')")
    con.commit()
    con.close()
    return a


def same_agent(b: Agent, a: Agent) -> bool:
    """The same files (a SQLite database by its rows: it travels as a snapshot)."""
    mine, theirs = agent_files(b.folders.root), agent_files(a.folders.root)
    db = "Home/notes/state.db"
    assert mine.pop(db)[:3] == theirs.pop(db)[:3]  # kind, mode, mtime
    rows = []
    for agent in (a, b):
        con = sqlite3.connect(agent.folders.home / "notes" / "state.db")
        rows.append(con.execute("SELECT v FROM t").fetchall())
        con.close()
    return mine == theirs and rows[0] == rows[1] == [("before",)]


def test_a_first_moves_final_carries_what_changed_and_the_same_agent_arrives(
    src: Machine, dst: Machine
) -> None:
    a = _agent(src)
    r = prepare(dst, a.id)
    bulk, brep = send_bytes(a, r, phase="bulk")
    assert not receive_bytes(dst, r, bulk).committed
    assert r.own_base() and (r.dir / BULK_BASE / "Home" / "proj" / "a" / "f3.txt").is_file()
    assert not any(r.objects.iterdir())  # the bulk's content is the base's now
    # the agent works on while the bulk was received
    fill_collections(a, events=2)
    write(a.folders.home / "notes" / "f3.txt", b"changed after the bulk\n")
    write(a.folders.home / "new" / "n.txt", b"new after the bulk\n")
    inv = r.inventory()
    assert "Home/proj" in inv.dirs  # the kept bulk's folders, by digest
    final, frep = send_bytes(
        a, r, phase="final", since=brep.watermarks, base_stream=brep.stream_id, inventory=inv
    )
    # Home/proj (60 files) and the Agent/ roots held whole: one entry each
    assert frep.kept_folders >= 2
    files = [k for k, v in agent_files(a.folders.root).items() if v[0] == "f"]
    assert frep.files <= len(files) - 60
    changed = len(b"changed after the bulk\n") + len(b"new after the bulk\n")
    assert changed <= frep.data_bytes < 10_000  # (the database's snapshot may go again)
    rep = receive_bytes(dst, r, final)
    assert rep.committed
    b = load_agent(dst)
    assert same_agent(b, a)
    assert collections_of(b) == collections_of(a)
    assert (b.folders.home / "report-link.txt").stat().st_nlink == 2  # the hard link kept
    assert os.readlink(b.folders.home / "passwd") == "/etc/passwd"
    assert not r.dir.exists()  # the receiver, its kept bulk with it, is gone
    # the arrived agent's hash cache vouches for its files: the next send hashes none
    cache = HashCache(dst.runtime_dir(a.id) / "hashes.sqlite")
    try:
        f = b.folders.home / "proj" / "b" / "f7.txt"
        assert cache.lookup("Home/proj/b/f7.txt", os.lstat(f)) is not None
    finally:
        cache.close()


def test_content_the_bulk_could_not_settle_comes_with_the_final(src: Machine, dst: Machine) -> None:
    """A file that changed while the bulk read it (its bytes do not match its SHA-256:
    the bulk keeps nothing of it) is left out of the kept bulk, so its folder's digest
    differs, and the final carries it."""
    a = make_agent(src)
    write(a.folders.home / "d" / "x.txt", b"real", 0o644, OLD)
    write(a.folders.home / "d" / "y.txt", b"other\n", 0o644, OLD)
    r = prepare(dst, a.id)
    h = head(a.id, a.settings.owner, phase="bulk")
    torn = fentry("Home/d/x.txt", b"fake", sha256=sha(b"real"), mtime_ns=OLD)
    y = fentry("Home/d/y.txt", b"other\n", mtime_ns=OLD)
    entries = [*roots(), dentry("Home/d"), torn, y]
    bulk = seal(public(r), payload(h, entries, b"fake" + b"other\n"))
    brep = receive_bytes(dst, r, bulk)
    assert not brep.committed and r.own_base()
    assert not (r.dir / BULK_BASE / "Home" / "d" / "x.txt").exists()  # left out
    assert (r.dir / BULK_BASE / "Home" / "d" / "y.txt").read_bytes() == b"other\n"
    final, frep = send_bytes(
        a, r, phase="final", base_stream=brep.stream_id, inventory=r.inventory()
    )
    assert frep.data_bytes >= 4  # x.txt's bytes come with the final
    assert receive_bytes(dst, r, final).committed
    b = load_agent(dst)
    assert (b.folders.home / "d" / "x.txt").read_bytes() == b"real"
    assert (b.folders.home / "d" / "y.txt").read_bytes() == b"other\n"


def test_an_interrupted_receivers_kept_bulk_is_not_sent_again(src: Machine, dst: Machine) -> None:
    a = _agent(src)
    r = prepare(dst, a.id)
    bulk, brep = send_bytes(a, r, phase="bulk")
    receive_bytes(dst, r, bulk)
    assert brep.data_bytes > 10_000 and r.own_base()
    r2 = prepare(dst, a.id)  # the move failed after the bulk and runs again
    assert not r.dir.exists()
    again, rep2 = send_bytes(a, r2, phase="bulk", inventory=r2.inventory())
    assert rep2.data_bytes == 0  # every file's content was adopted from the kept bulk
    receive_bytes(dst, r2, again)
    final, _ = send_bytes(
        a, r2, phase="final", since=rep2.watermarks, base_stream=rep2.stream_id,
        inventory=r2.inventory(),
    )  # fmt: skip
    assert receive_bytes(dst, r2, final).committed
    assert same_agent(load_agent(dst), a)


@pytest.mark.parametrize("claim", ["another digest", "a folder it never had", "inside"])
def test_a_final_claiming_what_the_kept_bulk_does_not_hold_is_refused(
    src: Machine, dst: Machine, claim: str
) -> None:
    """A hand-made final: a folder held whole with a digest the kept bulk does not have
    there, a folder it never had, or a file inside a folder it says is held whole."""
    a = _agent(src)
    r = prepare(dst, a.id)
    bulk, brep = send_bytes(a, r, phase="bulk")
    receive_bytes(dst, r, bulk)
    digest = r.dir_digest("Home/proj/b")
    assert digest
    entry = {
        "another digest": [dentry("Home/proj") | {"k": "cd" * 32}],
        "a folder it never had": [dentry("Home/elsewhere") | {"k": digest}],
        "inside": [
            dentry("Home/proj"),
            dentry("Home/proj/b") | {"k": digest},
            fentry("Home/proj/b/evil.txt", b"x"),
        ],
    }[claim]
    h = head(a.id, a.settings.owner, phase="final", base_stream=brep.stream_id)
    data = seal(public(r), payload(h, roots() + entry, b"x" if claim == "inside" else b""))
    before = machine_tree(dst)
    with pytest.raises(StreamError, match=r"indexed no such folder|held here whole"):
        receive_bytes(dst, r, data)
    assert machine_tree(dst) == before and not dst.folders("work").root.exists()


@pytest.mark.parametrize("where", ["outside", "dotdot", "not a digest"])
def test_an_earlier_receivers_index_moves_nothing_from_outside_its_kept_bulk(
    src: Machine, dst: Machine, tmp_path: Path, where: str
) -> None:
    """A prepare adopts an interrupted receiver's kept bulk file by file, by that
    receiver's own index: a row naming a file elsewhere (a person's, reached directly or
    through ``..``), or with no SHA-256 for a name, moves nothing."""
    a = _agent(src)
    r = prepare(dst, a.id)
    bulk, _ = send_bytes(a, r, phase="bulk")
    receive_bytes(dst, r, bulk)
    theirs = tmp_path / "persons-file.txt"
    theirs.write_bytes(b"a person's file\n")
    inside = r.dir / BULK_BASE / "Home"
    path, digest = {
        "outside": (str(theirs), "ab" * 32),
        "dotdot": (f"{inside}{'/..' * 64}{theirs}", "cd" * 32),
        "not a digest": (str(inside / "unindexed.txt"), "../../escape"),
    }[where]
    (inside / "unindexed.txt").write_bytes(b"in the kept bulk, not in its index\n")
    con = sqlite3.connect(r.dir / "local.sqlite")
    con.execute("INSERT INTO c VALUES (?, ?, ?)", (digest, path, "Home/x"))
    con.commit()
    con.close()
    r2 = prepare(dst, a.id)
    assert theirs.read_bytes() == b"a person's file\n"
    assert not any(p.name in ("ab" * 32, "cd" * 32) for p in r2.objects.iterdir())
    assert not os.path.lexists(r2.objects / ".." / ".." / "escape")
    assert len(list(r2.objects.iterdir())) > 50  # the kept bulk's own files were adopted
