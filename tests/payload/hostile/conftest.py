"""Destinations for the hostile-input corpus: a HOME, an agent, a receiver made by the CLI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile_kit import OWNER, Dest

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.settings import new_agent_id
from lnk.payload import safefs


@pytest.fixture(autouse=True)
def _remove_deep_trees(tmp_path: Path) -> Iterator[None]:
    """pytest's own clean-up of old tmp folders recurses: leave it nothing deep."""
    yield
    safefs.rmtree(tmp_path)


@pytest.fixture
def dest(tmp_path: Path) -> Dest:
    """The agent 'work' lives here with a few files; the receiver was prepared for it."""
    home = tmp_path / "home"
    home.mkdir()
    a = registry.create(Machine(home), "work", agent_id=new_agent_id(), owner=OWNER)
    (a.folders.home / "docs").mkdir()
    (a.folders.home / "docs" / "keep.txt").write_bytes(b"mine\n")
    (a.folders.agent / "memory" / "old.md").write_bytes(b"old memory\n")
    return Dest.make(home, a.id)


@pytest.fixture
def fresh(tmp_path: Path) -> Dest:
    """No agent here; the receiver was prepared with no agent in mind."""
    home = tmp_path / "fresh" / "home"
    home.mkdir(parents=True)
    return Dest.make(home, new_agent_id(), for_agent=False)
