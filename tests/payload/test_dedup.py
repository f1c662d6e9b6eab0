"""What the receiver holds already is not sent again."""

from __future__ import annotations

import os

import pytest
from payload_helpers import (
    agent_files,
    collections_of,
    fill_collections,
    load_agent,
    make_agent,
    move,
    prepare,
    receive_bytes,
    send_bytes,
    write,
)

from lnk.agents.layout import Machine
from lnk.errors import StreamError
from lnk.payload import receivers


def _agent_with_files(src: Machine, n: int = 6, size: int = 300_000):
    a = make_agent(src)
    blobs = {}
    for i in range(n):
        blobs[f"f{i}.bin"] = os.urandom(size)
        write(a.folders.home / "data" / f"f{i}.bin", blobs[f"f{i}.bin"])
    write(a.folders.agent / "memory" / "m.md", b"remember this\n")
    fill_collections(a)
    return a, blobs


def test_second_send_with_inventory_carries_nothing_unchanged(src: Machine, dst: Machine) -> None:
    a, blobs = _agent_with_files(src)
    first, _ = move(a, dst)
    assert first.data_bytes == sum(map(len, blobs.values())) + len(b"remember this\n")
    again, rrep = move(a, dst, agent_id=a.id, inventory=True)
    assert again.data_bytes == 0
    assert again.held_by_receiver == again.files
    assert rrep.data_bytes == 0 and rrep.committed
    assert rrep.unchanged_home_files == len(blobs)
    b = load_agent(dst)
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
    assert collections_of(b) == collections_of(a)


def test_only_the_changed_file_travels(src: Machine, dst: Machine) -> None:
    a, _blobs = _agent_with_files(src)
    move(a, dst)
    changed = os.urandom(12_345)
    write(a.folders.home / "data" / "f3.bin", changed)
    srep, rrep = move(a, dst, agent_id=a.id, inventory=True)
    assert srep.data_bytes == len(changed)
    assert rrep.data_bytes == len(changed)
    b = load_agent(dst)
    assert (b.folders.home / "data" / "f3.bin").read_bytes() == changed
    assert agent_files(b.folders.root) == agent_files(a.folders.root)


def test_without_agent_id_everything_travels_again(src: Machine, dst: Machine) -> None:
    a, blobs = _agent_with_files(src, n=2)
    move(a, dst)
    srep, _ = move(a, dst, inventory=True)  # the receiver was not told which agent comes
    assert srep.data_bytes == sum(map(len, blobs.values())) + len(b"remember this\n")


@pytest.mark.parametrize("cut", [0.5, 0.8])
def test_retry_after_an_interrupted_receive_sends_only_the_rest(
    src: Machine, dst: Machine, cut: float
) -> None:
    a, blobs = _agent_with_files(src, n=8)
    total = sum(map(len, blobs.values())) + len(b"remember this\n")
    r1 = prepare(dst, a.id)
    data, _ = send_bytes(a, r1, level=None)
    with pytest.raises(StreamError):
        receive_bytes(dst, r1, data[: int(len(data) * cut)])
    assert not dst.folders("work").root.exists()
    staged = {p.name: p.stat().st_size for p in r1.objects.iterdir()}
    assert 0 < len(staged) < len(blobs)
    r2 = prepare(dst, a.id)
    assert not r1.dir.exists()  # its staged content was adopted, the rest abandoned
    assert sorted(p.name for p in r2.objects.iterdir()) == sorted(staged)
    data2, srep = send_bytes(a, r2, inventory=r2.inventory())
    assert srep.data_bytes == total - sum(staged.values())
    rrep = receive_bytes(dst, r2, data2)
    assert rrep.committed
    b = load_agent(dst)
    assert agent_files(b.folders.root) == agent_files(a.folders.root)


def test_inventory_round_trips_its_bytes(src: Machine, dst: Machine) -> None:
    from lnk.payload.inventory import Inventory

    a, blobs = _agent_with_files(src, n=2)
    move(a, dst)
    r = prepare(dst, a.id)
    inv = r.inventory()
    back = Inventory.from_bytes(inv.to_bytes())
    assert len(back) == len(inv) >= 3
    from payload_helpers import sha

    for blob in blobs.values():
        assert sha(blob) in back
    assert sha(b"not there") not in back


def test_a_prepare_counts_what_the_receiver_holds_as_its_inventory_lists_it(
    src: Machine, dst: Machine
) -> None:
    """``Prepared.holds`` is counted, not listed: the same number as the inventory's,
    with staged content both new and also in the base (counted once)."""
    from payload_helpers import sha

    a, blobs = _agent_with_files(src, n=3)
    move(a, dst)
    r = prepare(dst, a.id)
    before = len(r.inventory())
    assert r.holds() == before >= 3
    one = next(iter(blobs.values()))
    (r.objects / sha(one)).write_bytes(one)  # held twice: once
    (r.objects / sha(b"staged only")).write_bytes(b"staged only")
    (r.objects / "not-a-digest").write_bytes(b"x")
    assert r.holds() == len(r.inventory()) == before + 1
    bare = prepare(dst)
    (bare.objects / sha(b"staged only")).write_bytes(b"staged only")
    assert bare.holds() == len(bare.inventory()) == 1


def test_held_among_answers_as_held_does_one_by_one(src: Machine, dst: Machine) -> None:
    """A final naming thousands of files asks in one query what ``held`` answers for
    each: content staged, a base file as indexed, and not a row that points outside
    the base or the receiver's folder (the index is a file on disk)."""
    import sqlite3

    from payload_helpers import sha

    a, blobs = _agent_with_files(src, n=3)
    move(a, dst)
    r = prepare(dst, a.id)
    (r.objects / sha(b"staged only")).write_bytes(b"staged only")
    con = sqlite3.connect(r.dir / "local.sqlite")
    con.execute("INSERT INTO c VALUES (?, ?, ?)", (sha(b"outside"), str(src.home / "x"), "Home/x"))
    con.execute(
        "INSERT INTO c VALUES (?, ?, ?)",
        (sha(b"snapshot"), str(r.dir / "snapshots" / "s1"), "Agent/memory/db"),
    )
    con.commit()
    con.close()
    asked = [sha(b) for b in blobs.values()] + [
        sha(b"staged only"),
        sha(b"outside"),
        sha(b"snapshot"),
        sha(b"nowhere"),
    ]
    one_by_one = {s for s in asked if r.held(s) is not None}
    assert r.held_among(asked) == one_by_one
    assert {sha(b"staged only"), sha(b"snapshot"), *map(sha, blobs.values())} == one_by_one


def test_a_receivers_info_is_read_again_once_another_process_wrote_it(dst: Machine) -> None:
    r = prepare(dst)
    assert "mover_grants" not in r.info()
    other = receivers.open_receiver(dst, r.rid)  # another process's view, as a receive's
    other.set_info(mover_grants="[files]\n")
    assert r.info()["mover_grants"] == "[files]\n"
    mine = r.info()
    mine["base_root"] = "/elsewhere"  # a copy: the next caller reads what is on disk
    assert "base_root" not in r.info()


def test_a_folder_whose_size_in_the_index_is_no_number_is_not_named(
    src: Machine, dst: Machine
) -> None:
    """The receiver's index is a file on disk: a folder's size there that is no number
    (written by something else) names nothing held whole; the others still are."""
    import sqlite3

    from lnk.payload.folders import sending_digests

    a, _ = _agent_with_files(src, n=1)
    move(a, dst)
    r = prepare(dst, a.id)
    theirs = sending_digests(a.folders.root, a.runtime / "hashes.sqlite")
    named = set(r.inventory(theirs).dirs)
    assert {"Agent/instructions", "Agent/skills"} <= named
    con = sqlite3.connect(r.dir / "local.sqlite")
    con.execute("UPDATE d SET n = 'many' WHERE rel = 'Agent/skills'")
    con.commit()
    con.close()
    assert set(r.inventory(theirs).dirs) == named - {"Agent/skills"}
