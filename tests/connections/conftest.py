"""Fixtures for the connections' tests: the Bot API server on loopback (``telegram``), and
this computer with two local boxes (``world``, as the move tests have it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from telegram_api import telegram

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


_figures = {"cases": 0, "texts": 0, "answered": 0, "unknown": 0, "slots": 0}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """The fault matrix's figures, summed on the process that reports (xdist's too)."""
    for name, figures in report.user_properties:
        if name == "connection_figures" and report.when == "call" and report.passed:
            _figures["cases"] += 1
            for k in ("texts", "answered", "unknown", "slots"):
                _figures[k] += int(figures[k])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _figures["cases"]:
        f = _figures
        terminalreporter.write_line(
            f"connections fault matrix: {f['cases']} cases passed, {f['texts']} updates, "
            f"{f['answered']} answered once, {f['unknown']} unknown, {f['slots']} slots fired once"
        )
