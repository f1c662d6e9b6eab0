"""What a receiver already holds is never sent again: files, and conversations too."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from payload_helpers import (
    collections_of,
    fill_collections,
    load_agent,
    move,
    prepare,
    receive_bytes,
    sample_agent,
    send_bytes,
    write,
)

from lnk.agents.layout import Machine
from lnk.agents.stores import open_agent_store
from lnk.collections import CollectionId
from lnk.move.moved import leave


@pytest.mark.parametrize("store", ["files", "sqlite"])
def test_a_second_send_carries_only_new_events_and_drops_what_is_gone(
    src: Machine, dst: Machine, store: str
) -> None:
    a = sample_agent(src, store=store)
    fill_collections(a, events=40)
    move(a, dst)
    s = open_agent_store(a.folders.chats, store)
    thread = CollectionId("events", "link:main")
    last = s.last_number(thread)
    s.append(thread, last + 1, {"type": "message", "text": "new"})
    gone = next(c for c in s.collections() if c.shape == "map")
    s.drop(gone)
    maps = [c for c in s.collections() if c.shape == "map"]
    expected = 2 * len(s.collections()) + sum(len(list(s.items(c))) for c in maps) + 1
    s.close()
    r = prepare(dst, a.id)
    inv = r.inventory()
    assert inv.logs["events/link:main"][0] == last
    data, rep = send_bytes(a, r, inventory=inv)
    # each log goes as its header and end only, but for the one new event
    assert rep.collection_records == expected  # headers, ends, maps whole, one event
    assert rep.data_bytes == 0
    receive_bytes(dst, r, data)
    assert collections_of(load_agent(dst)) == collections_of(a)


def test_a_diverged_log_is_sent_whole(src: Machine, dst: Machine) -> None:
    a = sample_agent(src)
    fill_collections(a, events=5)
    move(a, dst)
    b = load_agent(dst)
    t = open_agent_store(b.folders.chats, b.settings.store)
    cid = CollectionId("events", "link:main")
    t.append(cid, t.last_number(cid) + 1, {"type": "message", "text": "only at b"})
    t.close()
    r = prepare(dst, a.id)
    data, _ = send_bytes(a, r, inventory=r.inventory())
    receive_bytes(dst, r, data)
    # the destination's own extra event is gone: the agent's state is replaced wholly
    assert collections_of(load_agent(dst)) == collections_of(a)


def test_the_receiver_remembers_every_hash_so_the_next_send_hashes_nothing(
    src: Machine, dst: Machine
) -> None:
    a = sample_agent(src)
    move(a, dst)
    b = load_agent(dst)
    con = sqlite3.connect(b.runtime / "hashes.sqlite")
    rows = dict(con.execute("SELECT dir || '/' || name, sha FROM h2").fetchall())
    con.close()
    rels = [
        p.relative_to(b.folders.root).parts
        for p in b.folders.root.rglob("*")
        if p.is_file() and not p.is_symlink()
    ]
    files = {"/".join(r) for r in rels if r[0] == "Home" or (r[0] == "Agent" and r[1] != "chats")}
    assert files and files <= set(rows)
    third = Machine(src.home.parent / "c")
    r = prepare(third)
    _, rep = send_bytes(b, r)
    assert rep.hashed_bytes == 0  # every file's SHA-256 came from the receiver's cache


def test_a_move_back_builds_on_the_folders_left_behind_and_then_removes_them(
    src: Machine, dst: Machine
) -> None:
    a = sample_agent(src)
    write(a.folders.home / "big.bin", b"x" * (3 << 20))
    fill_collections(a, events=30)
    move(a, dst)
    note = leave(src, a, "b")  # the agent answers at b now; a keeps its folders aside
    b = load_agent(dst)
    write(b.folders.home / "new.txt", b"made at b")
    r = prepare(src, b.id)
    inv = r.inventory()
    assert inv.logs  # the conversations left behind count
    data, rep = send_bytes(b, r, inventory=inv)
    assert rep.data_bytes == len(b"made at b")  # only what is new travels
    receive_bytes(src, r, data)
    back = load_agent(src)
    assert (back.folders.home / "big.bin").read_bytes() == b"x" * (3 << 20)
    assert (back.folders.home / "new.txt").read_bytes() == b"made at b"
    assert collections_of(back) == collections_of(b)
    assert not Path(note["kept"]).exists()  # the folders it left are in it again
    assert not (src.state_dir / "moved" / f"{b.id}.json").exists()
