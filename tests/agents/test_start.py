"""Starting agents from the command line: ports, sandbox policy, a harness that died."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from lnk.errors import Refused, SandboxUnavailable
from tests.lnkrun import lnk, ok

ENV = {"LNK_SERVICE_MANAGER": "process"}


def _settings(home: Path, name: str = "work") -> str:
    return (home / ".config/lnk/agents" / f"{name}.toml").read_text()


def test_a_held_port_moves_the_agent_before_it_starts(home: Path) -> None:
    ok("agent", "create", "work")
    base = ok("agent", "status", "--json").json()["ports"][0]
    held = socket.socket()
    held.bind(("127.0.0.1", base + 1))
    held.listen()
    try:
        r = ok("agent", "start", "--no-sandbox", env=ENV)
        assert f"holds a port of work's block {base}-{base + 3}" in r.err
        st = ok("agent", "status", "--json", env=ENV).json()
        assert st["running"] is True and st["ports"][0] != base and st["ports"][0] < 32768
        assert (
            ok("agent", "chat", "send", "hi", env=ENV)
            .out.strip()
            .endswith("(message 1 in link:main)")
        )
    finally:
        held.close()
        lnk("agent", "stop", env=ENV)


def test_no_sandbox_is_persistent_and_machine_can_refuse_it(home: Path) -> None:
    ok("agent", "create", "work")
    (home / ".lnk").mkdir(exist_ok=True)
    (home / ".lnk/machine.toml").write_text("unsandboxed = false\n")
    r = lnk("agent", "start", "--no-sandbox", env=ENV)
    assert r.code == Refused.exit_code and "unsandboxed = false" in r.err and "lnk: hint:" in r.err
    assert ok("agent", "status", "--json").json()["running"] is False


def test_missing_bubblewrap_refuses_with_the_fix(home: Path, tmp_path: Path) -> None:
    ok("agent", "create", "work")
    bare = tmp_path / "bin"
    bare.mkdir()
    r = lnk("agent", "start", env=ENV | {"PATH": str(bare)})
    assert r.code == SandboxUnavailable.exit_code
    assert "bubblewrap" in r.err.lower() or "bwrap" in r.err
    assert "lnk: hint:" in r.err
    st = ok("agent", "status", "--json").json()
    assert st["running"] is False and st["sandboxed"] is True  # nothing fell back silently


def test_status_says_a_harness_died(home: Path) -> None:
    ok("agent", "create", "work")
    ok("agent", "start", "--no-sandbox", env=ENV)
    st = ok("agent", "status", "--json", env=ENV).json()
    assert st["running"] is True and st["sandboxed"] is False
    rt = home / ".lnk/agents" / st["id"]
    harness_pid = json.loads((rt / "endpoint.json").read_text())["harness_pid"]
    os.kill(harness_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st = ok("agent", "status", "--json", env=ENV).json()
        if st["state"] == "died":
            break
        time.sleep(0.1)
    assert st["state"] == "died" and st["running"] is False
    assert st["exit"]["code"] != 0
    text = ok("agent", "status", env=ENV).out
    assert "state: died" in text and "exit: code" in text
