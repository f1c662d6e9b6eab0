"""The commit: decided once everything verified, then rolled forward, never back."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from payload_helpers import (
    agent_files,
    collections_of,
    fill_collections,
    load_agent,
    machine_tree,
    make_agent,
    move,
    prepare,
    receive_bytes,
    sample_agent,
    send_bytes,
    write,
)

from lnk.agents.layout import Machine
from lnk.errors import TransportError
from lnk.payload import commit, staging


class Crash(Exception):
    pass


def _expected(a: Any) -> dict[str, Any]:
    want = agent_files(a.folders.root)
    return want


def _complete(a: Any, dst: Machine) -> None:
    b = load_agent(dst)
    assert agent_files(b.folders.root) == _expected(a)
    assert collections_of(b) == collections_of(a)
    assert not any((dst.receivers_dir).iterdir())


def test_crash_right_after_decide_rolls_forward(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src)
    r = prepare(dst)
    data, _ = send_bytes(a, r)

    def crash(_r: Any, **_kw: Any) -> dict[str, Any]:
        raise Crash

    monkeypatch.setattr(commit, "apply", crash)
    with pytest.raises(Crash):
        receive_bytes(dst, r, data)
    assert (r.dir / commit.JOURNAL).exists()
    assert not dst.settings_file("work").exists()
    monkeypatch.undo()
    assert commit.finish_pending(dst) == ["work"]
    _complete(a, dst)
    assert commit.finish_pending(dst) == []


def test_the_next_receive_finishes_a_decided_commit(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src)
    r = prepare(dst)
    data, _ = send_bytes(a, r)
    monkeypatch.setattr(commit, "apply", lambda _r, **_kw: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        receive_bytes(dst, r, data)
    monkeypatch.undo()
    other = make_agent(src, "other")
    _, rrep = move(other, dst)
    assert rrep.committed
    _complete(a, dst)
    assert load_agent(dst, "other").id == other.id


def test_crash_after_the_agent_state_moved_rolls_forward(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src)
    move(a, dst)
    write(load_agent(dst).folders.agent / "memory" / "stale.md", b"stale")
    write(a.folders.home / "docs" / "new.txt", b"new")
    fill_collections(a, events=2)
    r = prepare(dst, a.id)
    data, _ = send_bytes(a, r, inventory=r.inventory())

    def crash(src_dir: Path, dest: Path) -> list[str]:
        raise Crash

    monkeypatch.setattr(commit, "_merge_home", crash)
    with pytest.raises(Crash):
        receive_bytes(dst, r, data)
    b = load_agent(dst)
    assert not (b.folders.agent / "memory" / "stale.md").exists()  # Agent/ already swapped
    assert not (b.folders.home / "docs" / "new.txt").exists()  # Home/ not merged yet
    monkeypatch.undo()
    commit.finish_pending(dst)
    _complete(a, dst)


def test_crash_between_the_two_renames_rolls_forward(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src)
    move(a, dst)
    write(a.folders.agent / "memory" / "more.md", b"more")
    r = prepare(dst, a.id)
    data, _ = send_bytes(a, r, inventory=r.inventory())
    real_rename = os.rename
    calls: list[str] = []

    def rename(x: Any, y: Any) -> None:
        calls.append(str(y))
        if len(calls) == 2:
            raise Crash
        real_rename(x, y)

    monkeypatch.setattr(commit.os, "rename", rename)
    with pytest.raises(Crash):
        receive_bytes(dst, r, data)
    monkeypatch.undo()
    assert not (dst.folders("work").agent).exists()  # the old state aside, the new not in place
    commit.finish_pending(dst)
    _complete(a, dst)


class _FullFile:
    def __init__(self, f: Any, room: list[int]) -> None:
        self.f, self.room = f, room

    def write(self, data: Any) -> int:
        n = len(data)
        if self.room[0] < n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room[0] -= n
        return int(self.f.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.f)


@pytest.mark.parametrize("room", [0, 100_000])
def test_disk_full_while_staging_leaves_the_destination_unchanged(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch, room: int
) -> None:
    a = sample_agent(src)
    move(a, dst)
    write(a.folders.home / "big.bin", os.urandom(400_000))
    r = prepare(dst, a.id)
    data, _ = send_bytes(a, r, inventory=r.inventory())
    before = machine_tree(dst)
    left = [room]
    real_open = open
    monkeypatch.setattr(
        staging, "open", lambda *a, **k: _FullFile(real_open(*a, **k), left), raising=False
    )
    real_write = staging._write_all

    def full_write(fd: int, data: memoryview) -> None:  # file bytes go by descriptor
        if left[0] < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left[0] -= len(data)
        real_write(fd, data)

    monkeypatch.setattr(staging, "_write_all", full_write)
    with pytest.raises(TransportError, match="disk is full") as info:
        receive_bytes(dst, r, data)
    assert info.value.hint and "nothing was applied" in info.value.hint
    assert machine_tree(dst) == before
    assert not (r.dir / commit.JOURNAL).exists()


@pytest.fixture
def small_disk(dst: Machine) -> Iterator[Path]:
    """The destination's ~/.lnk and ~/Link/Agents on one 2 MiB tmpfs (a receive stages in
    the one and renames into the other; needs root, as CI runs the tests)."""
    where = dst.home / "small"
    where.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], check=True)
    try:
        (where / "lnk").mkdir()
        (where / "Agents").mkdir()
        dst.state_dir.symlink_to(where / "lnk")
        dst.agents_root.parent.mkdir(parents=True, exist_ok=True)
        dst.agents_root.symlink_to(where / "Agents")
        yield where
    finally:
        if subprocess.run(["umount", str(where)], check=False).returncode:
            subprocess.run(["umount", "-l", str(where)], check=True)
            raise AssertionError("something still held the small disk open")


def test_a_real_full_disk(src: Machine, dst: Machine, small_disk: Path) -> None:
    a = make_agent(src)
    write(a.folders.home / "big.bin", os.urandom(3 << 20))
    fill_collections(a)
    r = prepare(dst)
    data, _ = send_bytes(a, r)
    before = machine_tree(dst)
    with pytest.raises(TransportError, match="disk is full"):
        receive_bytes(dst, r, data)
    assert machine_tree(dst) == before
    assert not dst.settings_file("work").exists()
    assert not dst.folders("work").root.exists()


def _own(dst: Machine, data: bytes) -> tuple[Any, str]:
    import hashlib

    r = prepare(dst)
    r.objects.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256(data).hexdigest()
    (r.objects / sha).write_bytes(data)
    return r, sha


def test_own_content_is_linked_in_three_calls_or_left_to_the_general_way(
    dst: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """commit._link_own: the receiver's own object that nothing else links becomes the
    file; anything else (linked elsewhere, a link, absent, swapped in between) is left
    to the general way with nothing made."""
    r, sha = _own(dst, b"content\n")
    obj = r.objects / sha
    t = tmp_path / "t1"
    assert commit._link_own(r, sha, str(t))
    assert t.stat().st_ino == obj.stat().st_ino and t.read_bytes() == b"content\n"
    # now it has two names: a second file of that content is not a third name of it
    assert not commit._link_own(r, sha, str(tmp_path / "t2"))
    assert not (tmp_path / "t2").exists()
    assert not commit._link_own(r, "ab" * 32, str(tmp_path / "t3"))  # held nowhere here
    r2, sha2 = _own(dst, b"other\n")
    (r2.objects / sha2).unlink()
    os.symlink("/etc/hostname", r2.objects / sha2)
    assert not commit._link_own(r2, sha2, str(tmp_path / "t4"))  # a link, never taken
    assert not os.path.lexists(tmp_path / "t4")
    # swapped for another file between its lstat and its link: the link is undone
    r3, sha3 = _own(dst, b"third\n")
    real_link = os.link

    def swapping(src: Any, dst_: Any, **kw: Any) -> None:
        other = tmp_path / "other"
        other.write_bytes(b"not what was checked\n")
        os.replace(other, src)
        real_link(src, dst_, **kw)

    monkeypatch.setattr(commit.os, "link", swapping)
    assert not commit._link_own(r3, sha3, str(tmp_path / "t5"))
    assert not os.path.lexists(tmp_path / "t5")
