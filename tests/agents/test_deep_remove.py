"""An agent whose Home is thousands of folders deep is removed whole, without a traceback."""

from __future__ import annotations

import os
from pathlib import Path

from lnkrun import lnk

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.fsutil import rmtree

DEPTH = 1500  # deeper than Python's recursion limit: shutil.rmtree would fail here


def _deep(top: Path, outside: Path | None = None) -> None:
    """DEPTH folders under ``top``, made one below the other through descriptors."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(DEPTH):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"bottom")
        os.close(leaf)
    finally:
        os.close(fd)
    if outside is not None:
        os.symlink(outside, top / "out-link")  # removed as a link, never followed


def test_remove_of_an_agent_with_a_deep_home(home: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    m = Machine(home)
    a = registry.create(m, "deep")
    _deep(a.folders.home, outside)
    r = lnk("agent", "remove", "deep", "--yes", "--files", "delete")
    assert r.code == 0, r.err
    assert "Traceback" not in r.err
    assert not a.folders.root.exists()
    assert (outside / "keep.txt").read_text() == "keep"  # the link was not followed


def test_rmtree_removes_any_depth_and_never_follows(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    top = tmp_path / "tree"
    _deep(top, outside)
    os.symlink(outside, top / "d" / "out-link")
    assert rmtree(top) is True
    assert not top.exists()
    assert (outside / "keep.txt").read_text() == "keep"
    assert rmtree(tmp_path / "never-was") is True
