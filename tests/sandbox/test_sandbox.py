"""The agent's sandbox under real bubblewrap, and the harness inside it."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.collections import CollectionId, open_store
from lnk.errors import SandboxUnavailable
from lnk.harness import client
from lnk.runtime.runner import descendants
from lnk.sandbox.bwrap import check_bwrap, sandboxed
from tests.procs import process_runs


def test_check_bwrap_without_bwrap_names_the_fix(tmp_path: Path) -> None:
    (tmp_path / "true").symlink_to("/bin/true")
    with pytest.raises(SandboxUnavailable) as ei:
        check_bwrap(path=str(tmp_path))
    assert "not installed" in ei.value.message
    assert "apt-get install bubblewrap" in (ei.value.hint or "")
    assert "AppArmor" in (ei.value.hint or "") and "--no-sandbox" in (ei.value.hint or "")


def test_check_bwrap_that_cannot_run_says_why(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable) as ei:
        check_bwrap(path=str(tmp_path))
    assert "Permission denied" in ei.value.message
    assert "apt-get install bubblewrap" in (ei.value.hint or "")


def test_check_bwrap_here() -> None:
    assert check_bwrap().endswith("bwrap")


@pytest.fixture
def agent(home: Path) -> registry.Agent:
    a = registry.create(Machine.current(), "main")
    assert a.settings.sandbox is True  # on by default
    return a


def run_in(agent: registry.Agent, cmd: list[str]) -> subprocess.CompletedProcess[str]:
    argv = sandboxed(agent, cmd, bwrap=check_bwrap(), runtime=False)
    return argv.run(capture_output=True, text=True, timeout=60)


def sh(agent: registry.Agent, script: str) -> subprocess.CompletedProcess[str]:
    return run_in(agent, ["/bin/sh", "-c", script])


def test_the_sandbox_hides_settings_keys_and_other_agents(
    agent: registry.Agent, home: Path
) -> None:
    other = registry.create(Machine.current(), "other")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("secret")
    assert (home / ".config" / "lnk" / "agents" / "main.toml").exists()
    for hidden in (
        home / ".config" / "lnk",
        home / ".ssh",
        home / ".lnk",
        other.folders.root,
        home / "Link" / "Agents" / "other",
    ):
        p = sh(agent, f"test -e '{hidden}'")
        assert p.returncode == 1, f"{hidden} is visible inside the sandbox"
    p = sh(agent, f"ls -a '{home}'")
    assert p.returncode == 0 and p.stdout.split() == [".", "..", "Link"]
    assert sh(agent, f"test -d '{agent.folders.home}'").returncode == 0


def test_home_is_writable_and_config_is_not(agent: registry.Agent) -> None:
    f = agent.folders
    p = sh(
        agent,
        f"echo hi > '{f.home}/made-inside' && echo note > '{f.agent}/memory/n'"
        f" && echo c > '{f.chats}/c'",
    )
    assert p.returncode == 0, p.stderr
    assert (f.home / "made-inside").read_text() == "hi\n"
    assert (f.agent / "memory" / "n").read_text() == "note\n"
    before = f.sandbox_toml.read_text()
    assert sh(agent, f"cat '{f.sandbox_toml}'").stdout == before
    for target in (
        f.sandbox_toml,
        f.config / "new.toml",
        f.agent / "instructions" / "x",
        f.agent / "skills" / "x",
    ):
        p = sh(agent, f"echo '[network]' >> '{target}'")
        assert p.returncode != 0, f"{target} is writable inside the sandbox"
        assert "Read-only file system" in p.stderr
    assert f.sandbox_toml.read_text() == before
    assert sh(agent, f"rm -f '{f.sandbox_toml}'").returncode != 0
    assert f.sandbox_toml.exists()


def test_environment_is_cleared(agent: registry.Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leak")
    p = run_in(agent, ["/usr/bin/env"])
    env = dict(line.split("=", 1) for line in p.stdout.splitlines())
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"] == str(agent.folders.home) and env["LNK_SANDBOXED"] == "1"


@pytest.fixture
def host_server() -> Iterator[int]:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                c, _ = ls.accept()
            except OSError:
                return
            c.close()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield ls.getsockname()[1]
    stop.set()
    ls.shutdown(socket.SHUT_RDWR)
    ls.close()


def test_host_loopback_is_unreachable_inside(agent: registry.Agent, host_server: int) -> None:
    probe = [sys.executable, "-m", "lnk.harness", "probe-connect", "127.0.0.1", str(host_server)]
    assert subprocess.run(probe, timeout=60).returncode == 0  # reachable from the host
    p = run_in(agent, probe)
    assert p.returncode == 1, p.stderr
    p = run_in(
        agent, [sys.executable, "-c", "import socket; print([n for _, n in socket.if_nameindex()])"]
    )
    assert p.stdout.strip() == "['lo']"


def test_sandboxed_agent_answers_through_the_relay(start_agent: Any) -> None:
    r = start_agent("main", sandbox=True)
    assert r.endpoint["sandboxed"] is True
    sock = r.agent.net / "endpoint.sock"
    assert sock.is_socket()
    assert stat.S_IMODE(r.agent.net.stat().st_mode) == 0o700
    answer = client.send_message(r.port, r.key, "link:main", "hello", timeout=60)
    assert answer == "[main] you said: hello (message 1 in link:main)"
    st = client.status(r.port, r.key, timeout=60)
    assert st["sandboxed"] is True and st["id"] == r.agent.id and st["pid"] != r.proc.pid
    with open_store("files", r.agent.folders.chats) as store:
        evs = [e.data for e in store.read(CollectionId("events", "link:main"))]
    assert [e["text"] for e in evs] == ["hello", answer]
    # the harness runs in a network namespace other than ours
    ours = os.readlink("/proc/self/ns/net")
    inner = [p for p in descendants(r.endpoint["harness_pid"]) if not descendants(p)]
    assert inner and all(os.readlink(f"/proc/{p}/ns/net") != ours for p in inner)
    assert r.stop() == 0
    assert not sock.exists() and not (r.agent.runtime / "key").exists()
    for p in inner:
        assert not process_runs(p)


def test_harness_inside_sees_its_key_but_not_the_runtime(start_agent: Any) -> None:
    r = start_agent("main", sandbox=True)
    inner = [
        sys.executable,
        "-c",
        "import os,sys; "
        "sys.exit(0 if os.path.getsize('/run/lnk/key') == 32 and "
        f"not os.path.exists('{r.agent.runtime}') else 1)",
    ]
    argv = sandboxed(r.agent, inner, bwrap=check_bwrap())
    assert argv.run(timeout=60).returncode == 0
