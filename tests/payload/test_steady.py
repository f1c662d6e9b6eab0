"""Files of a folder the receiver holds whole, unchanged since the sender's digests.

The receiver names a folder held whole when it holds it as the sender had it when the
sender took its digests (``StateDigests.at``, given back in the inventory).  When the
folder changes after that (the agent writes while a move runs), the sender walks into
it; a subfolder where nothing changed since goes as one entry held whole, and a file
there that has not changed since (its change time older than the digests, and no
folder on its way renamed there since) goes without its bytes: one changed or added
file costs its own bytes, not its folder's (docs/stream-format.md 7.7).  Anything
moved, renamed, linked or written there since is sent, and the arrival is the agent
as it is.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path

import pytest
from payload_helpers import agent_files, load_agent, make_agent, move, prepare, write

from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.errors import InvalidInput
from lnk.payload import unchanged
from lnk.payload.folders import clock, sending_digests
from lnk.payload.hashcache import HashCache
from lnk.payload.inventory import Inventory
from lnk.payload.receive import receive
from lnk.payload.send import send_agent
from lnk.payload.send_files import SendReport
from lnk.payload.walk import WalkStats, walk_agent
from lnk.protocol import StateDigests

BODY = 600  # bytes of each file of the tree
OLD = 1_600_000_000_000_000_000  # their mtime: long settled, so the hash cache keeps them


def _tree(home: Path) -> int:
    """Four folders of five files, and one beside them; the bytes of all."""
    n = 0
    for d in range(4):
        for i in range(5):
            body = f"{d}/{i} ".encode().ljust(BODY, b".")
            write(home / f"d{d}" / "sub" / f"f{i}.txt", body, 0o644, OLD)
            n += BODY
    write(home / "top.txt", b"top\n", 0o644, OLD)
    return n + 4


def _after_every_change(a: Agent) -> None:
    """Wait until the file system's clock has passed every change time on the machine
    by the margin (the agent's files, and what a change brings into them; not Config/,
    where the clock is read)."""
    home, config = a.machine.home, a.folders.root / "Config"
    newest = max(
        os.lstat(p).st_ctime_ns for p in [home, *home.rglob("*")] if not p.is_relative_to(config)
    )
    for _ in range(1000):
        if clock(a.folders.root) > newest + unchanged.MARGIN_NS:
            return
        time.sleep(0.002)
    raise AssertionError("the file system's clock did not move")


def _resend(a: Agent, dst: Machine, change: object, at: bool = True) -> tuple[SendReport, int]:
    """An inventory against the agent's digests now; then ``change()``; then the send
    with that inventory, received; the destination must hold the agent as it is.  The
    send's report, and how many folders inside Home went held whole (not named: known
    unchanged since the digests; every named folder but Home is left unchanged)."""
    _after_every_change(a)
    r = prepare(dst, a.id)
    theirs = StateDigests(
        agent=a.name,
        id=a.id,
        at=clock(a.folders.root),
        dirs=sending_digests(a.folders.root, a.runtime / "hashes.sqlite"),
    )
    inv = Inventory.from_bytes(r.inventory(theirs.dirs, at=theirs.at if at else 0).to_bytes())
    assert "Home" in inv.dirs and (inv.at > 0) == at
    change()  # type: ignore[operator]
    path = dst.home.parent / "stream"
    with open(path, "wb") as f:
        rep = send_agent(a, f, r.key().public, inventory=inv)
    with open(path, "rb") as f:
        assert receive(dst, r.rid, f).committed
    # every file of the agent, as it is (a Home file only at a live destination stays
    # there: stream-format.md 7.6)
    assert agent_files(a.folders.root).items() <= agent_files(load_agent(dst).folders.root).items()
    return rep, rep.kept_folders - (len(inv.dirs) - 1)


def test_one_file_changed_after_the_inventory_sends_its_bytes_alone(
    src: Machine, dst: Machine
) -> None:
    a = make_agent(src)
    _tree(a.folders.home)
    move(a, dst)
    changed = a.folders.home / "d2" / "sub" / "f3.txt"
    rep, quiet = _resend(a, dst, lambda: changed.write_bytes(b"changed\n"))
    assert rep.data_bytes == len(b"changed\n")
    assert quiet == 3  # d0, d1 and d3, each as one entry
    assert rep.held_unchanged == 5  # the other four of d2/sub, and top.txt


def test_without_the_time_of_the_digests_the_changed_folder_goes_whole(
    src: Machine, dst: Machine
) -> None:
    """An inventory from an older receiver (no ``at``): the folder named whole that
    changed is sent as it is, every file of it with its bytes, as before."""
    a = make_agent(src)
    total = _tree(a.folders.home)
    move(a, dst)
    changed = a.folders.home / "d2" / "sub" / "f3.txt"
    rep, quiet = _resend(a, dst, lambda: changed.write_bytes(b"changed\n"), at=False)
    assert rep.held_unchanged == 0 and quiet == 0
    assert rep.data_bytes == total - BODY + len(b"changed\n")


def test_a_folder_moved_into_a_named_folder_is_sent_and_its_neighbours_are_not(
    src: Machine, dst: Machine
) -> None:
    """Its files are older than the digests, but it was renamed into a folder whose
    entries changed: nothing in it is vouched for; the rest of the tree is."""
    a = make_agent(src)
    _tree(a.folders.home)
    move(a, dst)
    outside = src.home / "elsewhere"
    for i in range(3):
        write(outside / f"new{i}.txt", f"new {i}\n".encode() * 40)

    def arrive() -> None:
        os.rename(outside, a.folders.home / "d1" / "moved")

    rep, quiet = _resend(a, dst, arrive)
    # d1 changed (an entry added): what it held is still where it was; the folder that
    # arrived was renamed there, so nothing in it is vouched for (its files go with bytes)
    assert rep.data_bytes == 3 * len(b"new 0\n" * 40)
    assert quiet == 3 + 1  # d0, d2, d3, and d1/sub
    assert rep.held_unchanged == 1  # top.txt


@pytest.mark.parametrize("how", ["rename-across", "swap", "link-and-write"])
def test_files_renamed_swapped_or_written_through_a_link_are_sent(
    src: Machine, dst: Machine, how: str
) -> None:
    a = make_agent(src)
    _tree(a.folders.home)
    move(a, dst)
    home = a.folders.home
    f0, f1 = home / "d0" / "sub" / "f0.txt", home / "d0" / "sub" / "f1.txt"

    def change() -> None:
        if how == "rename-across":
            os.rename(f0, home / "d3" / "sub" / "f9.txt")
        elif how == "swap":
            os.rename(f0, home / "d0" / "sub" / "tmp")
            os.rename(f1, f0)
            os.rename(home / "d0" / "sub" / "tmp", f1)
        else:
            other = src.home / "other-name"
            os.link(f0, other)
            with open(other, "r+b") as f:
                f.write(b"X")

    rep, quiet = _resend(a, dst, change)
    # what arrives is the agent as it is (checked by _resend); a file renamed (its change
    # time set) or written through another name is not vouched for, its neighbours are
    assert (quiet, rep.held_unchanged) == {
        "rename-across": (2, 4 + 5 + 1),  # d1, d2 whole; d0/sub's four, d3/sub's five
        "swap": (3, 3 + 1),  # d1, d2, d3 whole; d0/sub's three left alone
        "link-and-write": (3, 4 + 1),  # d1, d2, d3 whole; d0/sub's four others
    }[how]


def test_a_file_added_to_a_flat_named_folder_costs_itself(src: Machine, dst: Machine) -> None:
    """A folder of files side by side (a person's photos, an agent's notes): one file
    added there after the digests changes the folder, not its other files."""
    a = make_agent(src)
    for i in range(10):
        write(a.folders.home / "flat" / f"p{i}.jpg", bytes([i]) * 5000, 0o644, OLD)
    move(a, dst)
    rep, _ = _resend(a, dst, lambda: write(a.folders.home / "flat" / "new.jpg", b"new" * 100))
    assert rep.data_bytes == 300 and rep.held_unchanged == 10


@pytest.mark.parametrize(
    "how", ["replaced", "moved-within", "root-replaced", "folder-moved-then-hashed"]
)
def test_a_folder_renamed_in_place_of_another_is_sent(src: Machine, dst: Machine, how: str) -> None:
    """A folder renamed where another was (from outside the agent, or from elsewhere in
    the named folder): its files are older than the digests, but it is not where it
    was, so none of them is vouched for."""
    a = make_agent(src)
    _tree(a.folders.home)
    move(a, dst)
    home = a.folders.home
    outside = src.home / "other-tree"
    for i in range(5):
        write(outside / "sub" / f"f{i}.txt", f"other {i} ".encode().ljust(BODY, b"-"), 0o644, OLD)

    def change() -> None:
        if how == "replaced":
            os.rename(home / "d2", src.home / "d2-old")
            os.rename(outside, home / "d2")
        elif how == "root-replaced":  # the folder named held whole, itself
            os.rename(home, src.home / "home-old")
            os.rename(outside, home)
        elif how == "moved-within":
            os.rename(home / "d0" / "sub", home / "d3" / "sub2")
        else:  # d0 moved whole into d3, and its files hashed there since (a backup ran):
            # its subfolder, unchanged, has a digest, but its folder was renamed there
            os.rename(home / "d0", home / "d3" / "d0moved")
            cache = HashCache(a.runtime / "hashes.sqlite")
            try:
                for _ in walk_agent(a.folders.root, cache, WalkStats()):
                    pass
            finally:
                cache.close()

    rep, quiet = _resend(a, dst, change)
    # files not where they were: with their bytes; the rest of the tree without (d3 and
    # Home both changed entries when d0 moved into d3: d3's own sub goes too)
    assert rep.data_bytes == (10 if how == "folder-moved-then-hashed" else 5) * BODY
    assert (quiet, rep.held_unchanged) == {
        "replaced": (3, 1),
        "moved-within": (3, 1),  # d1, d2 and d3/sub whole; d3/sub2 arrived: walked
        "root-replaced": (0, 0),
        "folder-moved-then-hashed": (2, 1),  # d1, d2 whole; d3 and d0moved walked
    }[how]


def test_a_bulk_takes_the_named_folders_as_named_and_the_final_sends_the_change(
    src: Machine, dst: Machine
) -> None:
    """A bulk does not walk the folders its inventory names (named against this
    machine's own digests, moments before): one changed since goes with the bulk as
    named, and the final, which walks everything with the agent paused, carries the
    change; the arrival is the agent as it is."""
    a = make_agent(src)
    _tree(a.folders.home)
    move(a, dst)
    _after_every_change(a)
    r = prepare(dst, a.id)
    at = clock(a.folders.root)
    dirs = sending_digests(a.folders.root, a.runtime / "hashes.sqlite")
    inv = Inventory.from_bytes(r.inventory(dirs, at=at).to_bytes())
    assert "Home" in inv.dirs and inv.at == at
    changed = a.folders.home / "d2" / "sub" / "f3.txt"
    changed.write_bytes(b"changed\n")  # after the digests, before the bulk
    path = dst.home.parent / "stream"
    with open(path, "wb") as f:
        bulk = send_agent(a, f, r.key().public, phase="bulk", inventory=inv)
    assert bulk.data_bytes == 0 and bulk.kept_folders == len(inv.dirs)
    with open(path, "rb") as f:
        assert not receive(dst, r.rid, f).committed
    with open(path, "wb") as f:
        final = send_agent(
            a,
            f,
            r.key().public,
            phase="final",
            inventory=inv,
            since=bulk.watermarks,
            base_stream=bulk.stream_id,
        )
    assert final.data_bytes == len(b"changed\n")
    with open(path, "rb") as f:
        assert receive(dst, r.rid, f).committed
    got = load_agent(dst).folders.home / "d2" / "sub" / "f3.txt"
    assert got.read_bytes() == b"changed\n"
    assert agent_files(a.folders.root).items() <= agent_files(load_agent(dst).folders.root).items()


def test_the_clock_is_read_in_config_leaving_nothing(src: Machine) -> None:
    """The digests' time comes from the agent's own file system, through a file made and
    removed in Config/: the folders holding the file roots keep their change times."""
    a = make_agent(src)
    root, config = a.folders.root, a.folders.root / "Config"
    before = {p: os.lstat(p).st_ctime_ns for p in (root, root / "Agent", a.folders.home)}
    listed = sorted(os.listdir(config))
    at = clock(root)
    assert at > 0 and at >= os.lstat(config).st_ctime_ns - 10**9
    assert {p: os.lstat(p).st_ctime_ns for p in before} == before
    assert sorted(os.listdir(config)) == listed
    shutil.move(config, root / "Config-aside")
    os.symlink(root / "Config-aside", config)  # a link is not followed: no time then
    assert clock(root) == 0
    os.unlink(config)
    assert clock(root) == 0


@pytest.mark.parametrize("at", [-1, "now", 1.5, True, 1 << 63, None])
def test_an_inventory_with_a_bad_time_of_the_digests_is_refused(at: object) -> None:
    """The sender reads ``at`` from the inventory the receiving end wrote: a time that
    is not one is refused in one clear error, not half believed."""
    import json
    import struct

    from lnk.payload.inventory import MAGIC2

    meta = json.dumps({"logs": {}, "dirs": {}, "at": at}).encode()
    data = MAGIC2 + struct.pack(">I", len(meta)) + meta
    with pytest.raises(InvalidInput, match="time of the sender's digests"):
        Inventory.from_bytes(data)
    with pytest.raises(InvalidInput, match="time of the sender's digests"):
        Inventory.at_of(io.BytesIO(data))  # the header alone, as the mover reads it


def test_an_inventory_carries_the_time_of_the_digests() -> None:
    inv = Inventory.of([b"\x01" * 32])
    inv.at = 1_796_547_003_962_220_660
    back = Inventory.from_bytes(inv.to_bytes())
    assert back.at == inv.at and b"\x01" * 32 in back
    assert Inventory.from_bytes(Inventory.of([]).to_bytes()).at == 0
    # its header alone says the same, without the digests (cut off here) being read
    assert Inventory.at_of(io.BytesIO(inv.to_bytes()[:-32])) == inv.at
    assert Inventory.at_of(io.BytesIO(Inventory.of([b"\x01" * 32]).to_bytes())) == 0
    with pytest.raises(InvalidInput, match="not an lnk inventory"):
        Inventory.at_of(io.BytesIO(b"not an inventory"))
    with pytest.raises(InvalidInput, match="ends in its header"):
        Inventory.at_of(io.BytesIO(inv.to_bytes()[:10]))
