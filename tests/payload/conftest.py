"""Two machines (HOME folders) for the stream engine's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnk.agents.layout import Machine


@pytest.fixture
def src(tmp_path: Path) -> Machine:
    """The machine the agent leaves."""
    return Machine(tmp_path / "a")


@pytest.fixture
def dst(tmp_path: Path) -> Machine:
    """The machine the agent arrives at."""
    return Machine(tmp_path / "b")
