"""Paths of any depth and length the spec allows: applied, or refused in one line.

Nothing recurses on depth (removing trees, walking them), and a receive that
committed is never reported as failed because its clean-up met a deep tree.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hostile_kit import Dest, chain, dentry, fentry, lnk, records, roots, tree

from lnk.payload import safefs

REFUSED, STREAM = 6, 10


def _deep(depth: int, name: str = "a") -> tuple[list[dict[str, object]], str]:
    last = "Home" + f"/{name}" * depth + "/f"
    return [*roots(), *chain(depth, name), fentry(last, b"deep\n")], last


def _make_deep(top: Path, depth: int) -> None:
    """A tree ``depth`` folders deep, made folder by folder (its path may pass PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


def test_a_path_1000_folders_deep_is_applied_and_sent_again(fresh: Dest, tmp_path: Path) -> None:
    ents, last = _deep(1000)
    out = fresh.accept(fresh.stream(records(fresh.head(), ents, b"deep\n")))
    assert "received work" in out
    assert (fresh.agent_root / last).read_bytes() == b"deep\n"
    assert not list((fresh.home / ".lnk" / "receivers").iterdir()), "the receiver stayed"
    # and it leaves again: the sender's walk is not recursive either
    there = tmp_path / "there"
    there.mkdir()
    other = Dest.make(there, fresh.agent_id, for_agent=False)
    p = lnk(fresh.home, "agent", "state-send", "--to", other.pub.text())
    assert p.returncode == 0, p.stderr.decode()
    other.accept(p.stdout)
    assert (other.agent_root / last).read_bytes() == b"deep\n"


def test_a_path_2000_folders_deep_is_refused_here_in_one_line(fresh: Dest) -> None:
    ents, last = _deep(2040)  # 4085 bytes: valid, but not below this HOME
    assert len(last.encode()) <= 4096
    fresh.refuse(
        fresh.stream(records(fresh.head(), ents, b"deep\n")), REFUSED, "too long to be written here"
    )


def test_a_path_of_exactly_4096_bytes_is_refused_here(fresh: Dest) -> None:
    name = "n" * 255
    ents, p = [*roots()], "Home"
    while len(p) + 256 < 4096 - 4:
        p += "/" + name
        ents.append(dentry(p))
    pad = "x" * (4096 - len(p) - 1)
    ents.append(fentry(f"{p}/{pad}", b"x"))
    assert len(ents[-1]["p"].encode()) == 4096
    fresh.refuse(fresh.stream(records(fresh.head(), ents, b"x")), REFUSED, "too long")


def test_a_path_of_4097_bytes_breaks_the_spec(fresh: Dest) -> None:
    p = "Home/" + "/".join(["m" * 200] * 20)
    p += "/" + "z" * (4097 - len(p) - 1)
    fresh.refuse(
        fresh.stream(records(fresh.head(), [*roots(), fentry(p, b"")])),
        STREAM,
        "longer than 4096 bytes",
    )


def test_names_of_255_bytes_ten_deep_are_applied(fresh: Dest) -> None:
    name = "é" * 127 + "n"  # 255 bytes of UTF-8
    ents, last = _deep(10, name)
    fresh.accept(fresh.stream(records(fresh.head(), ents, b"deep\n")))
    assert (fresh.agent_root / last).read_bytes() == b"deep\n"


def test_a_name_of_256_bytes_is_refused(fresh: Dest) -> None:
    ents = [*roots(), fentry("Home/" + "é" * 128, b"")]
    fresh.refuse(fresh.stream(records(fresh.head(), ents)), STREAM, "longer than 255 bytes")


def test_replacing_an_agent_whose_old_folders_are_deeper_than_path_max(dest: Dest) -> None:
    """The old Agent/ goes at the commit: a tree 2500 folders deep in it is removed, and
    the receive is reported as what it was, committed."""
    _make_deep(dest.agent_root / "Agent" / "memory", 2500)
    data = dest.stream(records(dest.head(), [*roots(), fentry("Home/new", b"new")], b"new"))
    p = dest.receive(data, "--json")
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout)["committed"] is True
    assert not (dest.agent_root / "Agent" / "memory" / "d").exists()
    assert not list((dest.home / ".lnk" / "receivers").iterdir())


def test_rmtree_is_iterative_and_follows_no_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"keep")
    top = tmp_path / "top"
    top.mkdir()
    _make_deep(top, 3000)
    os.symlink(outside, top / "link")
    (top / "sub").mkdir()
    os.symlink(outside / "precious", top / "sub" / "file-link")
    assert safefs.rmtree(top)
    assert not top.exists()
    assert (outside / "precious").read_bytes() == b"keep"
    assert safefs.rmtree(top)  # gone already: fine
    assert tree(outside) == {"precious": tree(outside)["precious"]}


def test_an_agent_of_many_long_paths_is_sent_in_files_records_under_1_mib(
    fresh: Dest, tmp_path: Path
) -> None:
    """1500 entries of 770-byte paths would be a 1.3 MB FILES record: the sender cuts it."""
    ents, top = [*roots()], "Home/" + "l" * 250 + "/" + "m" * 250
    ents += [dentry(top.rsplit("/", 1)[0]), dentry(top)]
    for i in range(1500):
        ents.append(fentry(f"{top}/{i:04d}" + "p" * 250, b""))
    fresh.accept(fresh.stream(records(fresh.head(), ents)))
    there = tmp_path / "there"
    there.mkdir()
    other = Dest.make(there, fresh.agent_id, for_agent=False)
    p = lnk(fresh.home, "agent", "state-send", "--to", other.pub.text())
    assert p.returncode == 0, p.stderr.decode()
    other.accept(p.stdout)
    assert len(list((other.agent_root / top).iterdir())) == 1500
