"""Adapters' harnesses: a real Hermes (hermes-agent, pinned in lnk-hermes) against a local
OpenAI-compatible ModelServer, and fake adapters on PATH for the contract's refusals."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import ModelServer

HERMES_RELEASE = "0.19.0"
HERMES_VENV = Path(
    os.environ.get("LNK_HERMES_VENV") or Path.home() / ".cache" / "lnk" / f"hermes-{HERMES_RELEASE}"
)


@pytest.fixture
def hermes(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Hermes scripts/install.sh --test made, handed to lnk-hermes install; this
    suite's agents on ports of their own (the other suites' workers use offsets below)."""
    if not (HERMES_VENV / "bin" / "hermes").exists():
        pytest.fail(f"no Hermes at {HERMES_VENV}: run ./scripts/install.sh --test")
    if shutil.which("lnk-hermes") is None:
        pytest.fail("lnk-hermes is not on PATH: run ./scripts/install.sh --test")
    monkeypatch.setenv("LNK_HERMES_VENV", str(HERMES_VENV))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    monkeypatch.setenv("LNK_TEST_PORT_OFFSET", str(7000 + 200 * (index % 4)))
    return HERMES_VENV


@pytest.fixture
def model() -> Iterator[ModelServer]:
    server = ModelServer("tm")
    yield server
    server.stop()
