"""Folders held whole: a folder the receiver holds with the same digest at the same path
goes as one entry, is checked again at use, and (from the folders an agent left here)
comes back into place by one rename."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from payload_helpers import (
    agent_files,
    dentry,
    fentry,
    load_agent,
    make_agent,
    move,
    prepare,
    receive_bytes,
    send_bytes,
    write,
)
from test_hostile import Dest, dest, files  # noqa: F401 - the fixture is used by name

from lnk.agents.layout import Machine
from lnk.errors import Refused, StreamError
from lnk.move.moved import leave
from lnk.payload import commit
from lnk.payload.digests import tree_digests
from lnk.payload.hashcache import HashCache
from lnk.payload.receivers import Receiver
from lnk.payload.walk import WalkStats, walk_agent

OLD = 1_600_000_000_000_000_000


def _h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(root: Path, dirs: int = 4, per: int = 5) -> None:
    for d in range(dirs):
        for i in range(per):
            write(root / f"d{d}" / "sub" / f"f{i}.txt", f"{d}/{i}\n".encode() * 50, 0o644, OLD)
    write(root / "top.txt", b"top\n", 0o644, OLD)
    os.symlink("d0/sub/f0.txt", root / "link")


def test_an_unchanged_resend_carries_one_entry_per_root(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    _tree(a.folders.home)
    _tree(a.folders.agent / "skills")
    move(a, dst)
    srep, rep = move(a, dst, agent_id=a.id, inventory=True)
    assert rep.committed
    assert srep.files == 0 and srep.data_bytes == 0
    assert srep.kept_folders == srep.entries  # Home and each Agent/ root, nothing below
    assert agent_files(load_agent(dst).folders.root) == agent_files(a.folders.root)


def test_one_changed_file_sends_its_folders_and_keeps_the_rest(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    _tree(a.folders.home)
    move(a, dst)
    write(a.folders.home / "d2" / "sub" / "f3.txt", b"changed\n", 0o644, OLD + 1)
    srep, rep = move(a, dst, agent_id=a.id, inventory=True)
    assert rep.committed
    # Home, d2 and d2/sub are described (top.txt and the five files of d2/sub, one of
    # them with its bytes); d0, d1, d3 and every Agent/ root are held whole
    assert srep.files == 6 and srep.data_bytes == len(b"changed\n")
    assert srep.kept_folders >= 3
    there = load_agent(dst).folders.home
    assert (there / "d2" / "sub" / "f3.txt").read_bytes() == b"changed\n"
    assert agent_files(load_agent(dst).folders.root) == agent_files(a.folders.root)


def test_a_move_back_renames_the_kept_folders_into_place(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    _tree(a.folders.home)
    write(a.folders.home / "d1" / "sub" / "f0.txt", b"same content\n", 0o644, OLD)
    move(a, dst)
    note = leave(src, a, "b")
    kept = Path(note["kept"])
    inode = os.lstat(kept / "Home" / "d0" / "sub" / "f1.txt").st_ino
    b = load_agent(dst)
    # at b, the agent changes one folder and copies a file it holds in a kept one
    write(b.folders.home / "d3" / "new.txt", b"new at b\n", 0o644, OLD)
    write(b.folders.home / "d3" / "copy.txt", b"same content\n", 0o644, OLD)
    r = prepare(src, b.id)
    data, srep = send_bytes(b, r, inventory=r.inventory())
    assert srep.kept_folders >= 3
    rep = receive_bytes(src, r, data)
    assert rep.committed
    back = load_agent(src)
    home = back.folders.home
    assert os.lstat(home / "d0" / "sub" / "f1.txt").st_ino == inode  # renamed, not copied
    assert agent_files(back.folders.root) == agent_files(b.folders.root)
    # the copy of held content is a copy: the kept file is not linked to it
    assert os.lstat(home / "d1" / "sub" / "f0.txt").st_nlink == 1
    assert not kept.exists()
    # the kept folder's SHA-256s came along: a next send hashes nothing of it
    cache = HashCache(back.runtime / "hashes.sqlite")
    try:
        st = os.lstat(home / "d0" / "sub" / "f1.txt")
        assert cache.lookup("Home/d0/sub/f1.txt", st) is not None
    finally:
        cache.close()


def _resend_prepared(src: Machine, dst: Machine) -> tuple[Receiver, bytes]:
    """An agent moved to ``dst``, then sent again to a receiver prepared there (its
    stream not received yet): most of its folders go as held whole."""
    a = make_agent(src)
    _tree(a.folders.home)
    move(a, dst)
    r = prepare(dst, a.id)
    data, srep = send_bytes(a, r, inventory=r.inventory())
    assert srep.kept_folders > 0
    return r, data


def test_a_held_folder_that_changed_since_prepare_is_refused(src: Machine, dst: Machine) -> None:
    r, data = _resend_prepared(src, dst)
    there = load_agent(dst).folders.home / "d1" / "sub" / "f2.txt"
    write(there, b"changed at the destination after prepare\n", 0o644, OLD)
    with pytest.raises(Refused, match="changed since"):
        receive_bytes(dst, r, data)
    assert there.read_bytes() == b"changed at the destination after prepare\n"


def test_a_held_folder_swapped_for_a_link_is_refused(src: Machine, dst: Machine) -> None:
    r, data = _resend_prepared(src, dst)
    home = load_agent(dst).folders.home
    shutil.move(home / "d1", home.parent / "d1-elsewhere")
    os.symlink(home.parent / "d1-elsewhere", home / "d1")
    with pytest.raises(Refused):
        receive_bytes(dst, r, data)
    assert os.path.islink(home / "d1")


def test_a_folder_not_held_here_is_refused(dest: Dest) -> None:  # noqa: F811
    entry = dentry("Home/elsewhere") | {"k": "ab" * 32}
    dest.refuse(files(dest, [entry]), StreamError, "indexed no such folder")


def test_a_held_folder_with_another_digest_is_refused(dest: Dest) -> None:  # noqa: F811
    assert dest.r.dir_digest("Home/docs")  # the fixture's folder has a digest
    entry = dentry("Home/docs") | {"k": "cd" * 32}
    dest.refuse(files(dest, [entry]), StreamError, "indexed no such folder")


def test_nothing_goes_inside_a_held_folder(dest: Dest) -> None:  # noqa: F811
    digest = dest.r.dir_digest("Home/docs")
    assert digest
    entries = [dentry("Home/docs") | {"k": digest}, fentry("Home/docs/evil.txt", b"x")]
    dest.refuse(files(dest, entries), StreamError, "held here whole")


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"p": "Home/x", "t": "d", "m": 0o755, "k": "zz"}, "invalid digest"),
        ({"p": "Home/x", "t": "d", "m": 0o755, "k": 7}, "invalid digest"),
        (
            {"p": "Home/x", "t": "f", "m": 0o644, "s": 0, "h": "0" * 64, "d": False, "k": "a" * 64},
            "not a folder",
        ),
    ],
)
def test_bad_folder_digests_are_refused(dest: Dest, entry: dict[str, object], match: str) -> None:  # noqa: F811
    dest.refuse(files(dest, [entry]), StreamError, match)


def _hashed_digests(root: Path, cache_path: Path) -> tuple[dict[str, str], dict[str, int]]:
    """The digests from stats and the cache, once a walk has hashed every file."""
    cache = HashCache(cache_path)
    try:
        for _ in walk_agent(root, cache, WalkStats(), None, links=True, sqlite=False):
            pass
        return tree_digests(root, cache)
    finally:
        cache.close()


def test_a_folder_digest_follows_the_spec(tmp_path: Path) -> None:
    """The worked example of docs/stream-format.md, "Folder digests"."""
    root = tmp_path / "agent"
    write(root / "Home" / "a.txt", b"hello\n", 0o644, 1_700_000_000_000_000_000)
    (root / "Home" / "sub").mkdir(mode=0o755)
    os.chmod(root / "Home" / "sub", 0o755)
    os.symlink("a.txt", root / "Home" / "sub" / "l")
    digests, counts = _hashed_digests(root, tmp_path / "hashes.sqlite")
    digest, n = digests["Home/sub"], counts["Home/sub"]
    want_sub = _h(b"lnk-dir-1\nl\x00l\x00a.txt\n")
    assert digest == want_sub and n == 0
    os.chmod(root / "Home", 0o755)
    digests, counts = _hashed_digests(root, tmp_path / "hashes.sqlite")
    digest, n = digests["Home"], counts["Home"]
    sha_a = _h(b"hello\n")
    lines = (
        f"lnk-dir-1\nf\x00a.txt\x00644\x006\x001700000000000000000\x00{sha_a}\n"
        f"d\x00sub\x00755\x00{want_sub}\n"
    )
    assert digest == _h(lines.encode()) and n == 1
    assert json.dumps(digest)  # a plain hex string


class _Crash(Exception):
    pass


def test_a_kept_folder_swapped_for_a_link_after_the_decision_is_not_followed(
    src: Machine, dst: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit is decided, then (before the apply renames the held folders into
    place) the kept Home becomes a link to elsewhere: nothing is taken through it."""
    a = make_agent(src)
    _tree(a.folders.home)
    move(a, dst)
    kept = Path(leave(src, a, "b")["kept"])
    b = load_agent(dst)
    write(b.folders.home / "d3" / "new.txt", b"new at b\n", 0o644, OLD)  # Home is not held
    r = prepare(src, b.id)
    data, srep = send_bytes(b, r, inventory=r.inventory())
    assert srep.kept_folders >= 3

    def crash(_r: object, **_kw: object) -> None:
        raise _Crash

    monkeypatch.setattr(commit, "apply", crash)
    with pytest.raises(_Crash):
        receive_bytes(src, r, data)
    monkeypatch.undo()
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere / "d0" / "evil.txt", b"not the agent's\n")
    shutil.move(kept / "Home", tmp_path / "home-aside")
    os.symlink(elsewhere, kept / "Home")
    assert commit.finish_pending(src) == ["work"]
    home = load_agent(src).folders.home
    assert not (home / "d0" / "evil.txt").exists() and not os.path.islink(home / "d0")
    assert (home / "d3" / "new.txt").read_bytes() == b"new at b\n"
    assert (elsewhere / "d0" / "evil.txt").read_bytes() == b"not the agent's\n"


@pytest.mark.parametrize(
    "dirs",
    [
        ["Home", "ab" * 32],  # not an object
        {"Home": "AB" * 32},  # not lowercase hex
        {"Home": "ab" * 31},  # too short
        {"Home": 7},
    ],
)
def test_an_inventory_with_bad_folder_digests_is_refused(dirs: object) -> None:
    """The sender reads the inventory the receiving end wrote: damaged folder digests
    are refused in one clear error, not half believed."""
    import struct

    from lnk.errors import InvalidInput
    from lnk.payload.inventory import MAGIC2, Inventory

    meta = json.dumps({"logs": {}, "dirs": dirs}).encode()
    with pytest.raises(InvalidInput, match="inventory"):
        Inventory.from_bytes(MAGIC2 + struct.pack(">I", len(meta)) + meta)


def test_an_inventory_carries_its_folder_digests() -> None:
    from lnk.payload.inventory import Inventory

    inv = Inventory.of([b"\x01" * 32])
    inv.dirs = {"Home/src": "cd" * 32}
    back = Inventory.from_bytes(inv.to_bytes())
    assert back.dirs == {"Home/src": "cd" * 32} and b"\x01" * 32 in back
