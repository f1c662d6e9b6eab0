"""A folder of the agent's swapped for a link to somewhere else while a backup reads it:
what is outside the agent's folder is never read (the agent may do this from inside its
sandbox, to have a backup carry a file it cannot see)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bk_helpers import give_keys, sample_agent, write

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup import agent_files
from lnk.backup.agent import backup_agent
from lnk.backup.agent_restore import restore_agent
from lnk.payload.walk import WalkedFile

SECRET = b"the machine's own secret\n"


@pytest.mark.parametrize("ahead", [False, True], ids=["here", "read-ahead"])
def test_a_folder_swapped_for_a_link_after_the_walk_is_not_read_through(
    src: Machine,
    dst: Machine,
    local_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    ahead: bool,
) -> None:
    """Read by the backup's own thread, or by the second process ahead of it (its
    answer then names another file than the walk's: dropped, and read here)."""
    asked: list[int] = request.getfixturevalue("read_ahead_at_once") if ahead else []
    a = sample_agent(src)
    h = a.folders.home
    outside = tmp_path / "outside"
    for n in range(8):
        write(h / "notes" / f"n{n}.md", b"note %d\n" % n)
        write(outside / f"n{n}.md", SECRET)
    real = agent_files.walk_agent
    swapped: list[str] = []

    def walk(*args: Any, **kw: Any) -> Iterator[WalkedFile]:
        for f in real(*args, **kw):
            yield f
            if f.rel == "Home/notes/n0.md" and not swapped:
                # the walk has listed the folder; its files are read after this
                swapped.append(f.rel)
                os.rename(h / "notes", h / "notes.was")
                os.symlink(outside, h / "notes")

    monkeypatch.setattr(agent_files, "walk_agent", walk)
    backup_agent(src, a, local_url)
    assert swapped and (sum(asked) > 0) == ahead
    give_keys(src, dst)
    restore_agent(dst, "work", local_url)
    got = registry.find(dst, "work").folders.root
    for p in got.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert p.read_bytes() != SECRET, p
