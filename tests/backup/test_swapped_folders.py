"""A folder of the agent's swapped for a link to somewhere else while a backup reads it:
what is outside the agent's folder is never read (the agent may do this from inside its
sandbox, to have a backup carry a file it cannot see)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bk_helpers import give_keys, sample_agent, write
from swaps import SECRET, outside_with, swapping_walk

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup import agent_files
from lnk.backup.agent import backup_agent
from lnk.backup.agent_restore import restore_agent


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
    for n in range(8):
        write(h / "notes" / f"n{n}.md", b"note %d\n" % n)
    outside = outside_with(tmp_path, [f"n{n}.md" for n in range(8)])
    # once the walk has listed the folder: its files are read after this
    walk, swapped = swapping_walk(agent_files.walk_agent, "Home/notes/n0.md", h / "notes", outside)
    monkeypatch.setattr(agent_files, "walk_agent", walk)
    backup_agent(src, a, local_url)
    assert swapped and (sum(asked) > 0) == ahead
    give_keys(src, dst)
    restore_agent(dst, "work", local_url)
    got = registry.find(dst, "work").folders.root
    for p in got.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert p.read_bytes() != SECRET, p
