"""Fixtures for the trust tests: what a stream, a snapshot or a box may decide.

The move tests' helpers (tests/move/move_helpers.py) are shared: a World of
this computer and its boxes, each driven through the real ``lnk``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "move"))

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
