"""An arriving agent is staged and renamed into place: the agents' folder on another
filesystem than lnk's receivers is refused before anything is received, in one line."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from lnkrun import lnk, ok


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_restore_into_agents_on_another_filesystem(tmp_path: Path, tmpfs: Path) -> None:
    a, b, repo = tmp_path / "a", tmp_path / "b", tmp_path / "repo"
    for d in (a, b, repo):
        d.mkdir()
    ok("agent", "create", "work", home=a)
    (a / "Link" / "Agents" / "work" / "Home" / "note.txt").write_text("kept\n")
    ok("agent", "backup", "--agent", "work", "--to", f"file://{repo}", home=a)
    key = ok("backup", "key", "export", home=a).out
    ok("backup", "key", "import", home=b, input=key)
    (b / "Link").mkdir()
    (b / "Link" / "Agents").symlink_to(tmpfs)
    r = lnk("agent", "restore", "work", "--from", f"file://{repo}", home=b)
    assert r.code == 6 and r.err.count("lnk: error:") == 1, r.err
    assert "is on another filesystem than" in r.err and "nothing was received" in r.err
    assert "Traceback" not in r.err
    assert list(tmpfs.iterdir()) == []  # nothing of the agent there
    assert not (b / ".config" / "lnk" / "agents" / "work.toml").exists()
    # the same machine with its agents' folder back on lnk's filesystem restores
    (b / "Link" / "Agents").unlink()
    ok("agent", "restore", "work", "--from", f"file://{repo}", home=b)
    assert (b / "Link" / "Agents" / "work" / "Home" / "note.txt").read_text() == "kept\n"
