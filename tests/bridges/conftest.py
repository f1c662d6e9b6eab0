"""A real bridge server on a real unix socket, started per test and stopped after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import AGENT, OPEN, OWNER, Recorder, ServerFactory

from lnk.bridges.proof import new_key
from lnk.bridges.server import BridgeServer


@pytest.fixture
def key() -> bytes:
    return new_key()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def make_server(tmp_path: Path, key: bytes, recorder: Recorder) -> Iterator[ServerFactory]:
    """Start a BridgeServer (stopped at the end); keyword arguments override the defaults."""
    started: list[BridgeServer] = []

    def make(**kw: Any) -> BridgeServer:
        kw.setdefault("socket_path", tmp_path / "bridges" / "b.sock")
        kw.setdefault(
            "key_for", lambda agent, owner: key if (agent, owner) == (AGENT, OWNER) else None
        )
        kw.setdefault("handlers", {"echo": recorder.echo})
        server = BridgeServer(**kw)
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture(autouse=True)
def _close_raw_clients() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()
