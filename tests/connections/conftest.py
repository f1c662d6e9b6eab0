"""Fixtures for the connections' tests: the Bot API server on loopback (``telegram``), and
this computer with two local boxes (``world``, as the move tests have it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from telegram_api import telegram

from tests.hosts import Hosts, running_hosts
from tests.move.move_helpers import World, kill_agents

__all__ = ["telegram"]


@pytest.fixture
def world(home: Path, tmp_path: Path) -> Iterator[World]:
    w = World(here=home)
    w.add_local_box("b1", tmp_path / "b1-home")
    w.add_local_box("b2", tmp_path / "b2-home")
    try:
        yield w
    finally:
        kill_agents([w.here, *w.boxes.values()])


@pytest.fixture(scope="module")
def conn_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """SSH test hosts of the connections' tests' own (tag "c")."""
    with running_hosts(tmp_path_factory.mktemp("conn-hosts"), tag="c") as hosts:
        yield hosts
