"""Fixtures for the move tests: this computer, local boxes, and real SSH boxes."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts import Hosts
from move_helpers import World, kill_agents

_counts = {"cases": 0, "passed": 0}


@pytest.fixture
def world(home: Path, tmp_path: Path) -> Iterator[World]:
    """This computer (HOME) with two local boxes, b1 and b2."""
    w = World(here=home)
    w.add_local_box("b1", tmp_path / "b1-home")
    w.add_local_box("b2", tmp_path / "b2-home")
    try:
        yield w
    finally:
        kill_agents([w.here, *w.boxes.values()])


def _wipe(home: Path) -> None:
    for child in home.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


@pytest.fixture
def ssh_world(home: Path, ssh_hosts: Hosts) -> Iterator[World]:
    """This computer with the SSH boxes hostA and hostB (their HOMEs wiped after)."""
    w = World(here=home, env={"LNK_SSH_COMMAND": ssh_hosts.ssh_command})
    homes = [ssh_hosts[h].home for h in ("hostA", "hostB")]
    try:
        w.add_ssh_box("hostA", homes[0])
        w.add_ssh_box("hostB", homes[1])
        yield w
    finally:
        kill_agents([w.here, *homes])
        for h in homes:
            with contextlib.suppress(OSError):
                _wipe(h)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "test_fault" in report.nodeid and report.when == "call":
        _counts["cases"] += 1
        _counts["passed"] += int(report.passed)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _counts["cases"]:
        terminalreporter.write_line(
            f"move fault matrix: {_counts['cases']} cases, {_counts['passed']} passed"
        )
