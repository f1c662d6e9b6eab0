"""Fixtures for the agents' tests, the trust ones among them: what a stream, a snapshot or
a box may decide.

The move tests' helpers (tests/move/move_helpers.py) are shared: a World of
this computer and its boxes, each driven through the real ``lnk``.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "move"))

from hosts import Hosts
from move_helpers import World, kill_agents


@pytest.fixture
def world(home: Path, tmp_path: Path) -> Iterator[World]:
    """This computer (HOME) with one local box, b1."""
    w = World(here=home)
    w.add_local_box("b1", tmp_path / "b1-home")
    try:
        yield w
    finally:
        kill_agents([w.here, *w.boxes.values()])


@pytest.fixture
def ssh_box(home: Path, ssh_hosts: Hosts) -> Iterator[World]:
    """This computer with the bare SSH host hostC added as a box: ``lnk box add``
    installs this lnk there, so both ends run the code under test."""
    w = World(here=home, env={"LNK_SSH_COMMAND": ssh_hosts.ssh_command})
    box_home = ssh_hosts["hostC"].home
    try:
        w.ok("box", "add", "hostC", "hostC")
        w.boxes["hostC"] = box_home
        yield w
    finally:
        kill_agents([w.here, box_home])
        for child in box_home.iterdir():
            if child.name in (".config", ".lnk", "Link"):
                shutil.rmtree(child, ignore_errors=True)
