"""A real Hermes agent (hermes-agent 0.19.0, through lnk-hermes) run by lnk: created,
started in its sandbox behind its proxy, chatted with, stopped; and its configure's
``.lnk/configured``.  The model is tests/servers.py's ModelServer on loopback."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnkrun import Result, lnk
from servers import ModelServer

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.settings import ModelSettings
from lnk.harnesses import setup
from lnk.harnesses.adapter import Adapter

KEY = "sk-test-0123456789abcdef"


def ok(*args: str, home: Path, timeout: float = 300) -> Result:
    r = lnk(*args, home=home, env={"TEST_KEY": KEY}, timeout=timeout)
    assert r.code == 0, f"lnk {' '.join(args)} failed ({r.code}): {r.err}"
    return r


def create_hermes(home: Path, model: ModelServer, name: str = "work") -> Result:
    r = ok(
        "agent", "create", name, "--harness", "hermes", "--model", "test-model",
        "--model-url", model.base_url, "--key-env", "TEST_KEY", home=home,
    )  # fmt: skip
    ok("agent", "allow", "--agent", name, "--port", str(model.port), home=home)
    return r


def chat(home: Path, text: str, name: str = "work") -> str:
    r = ok("agent", "chat", "send", "--agent", name, "--json", text, home=home)
    return str(r.json()["answer"])


def hermes_home(home: Path, name: str = "work") -> Path:
    return home / "Link" / "Agents" / name / "Agent" / "harness"


def rows(home: Path, name: str = "work") -> dict[str, list[Any]]:
    """Hermes's own state: its sessions and their messages, as its state.db holds them."""
    db = sqlite3.connect(f"file:{hermes_home(home, name) / 'state.db'}?mode=ro", uri=True)
    try:
        return {
            "sessions": db.execute("SELECT id, source FROM sessions ORDER BY id").fetchall(),
            "messages": db.execute(
                "SELECT session_id, role, content FROM messages ORDER BY id"
            ).fetchall(),
        }
    finally:
        db.close()


def test_a_hermes_agent_starts_sandboxed_chats_and_stops(
    hermes: Path, model: ModelServer, home: Path
) -> None:
    created = create_hermes(home, model)
    assert "work runs hermes 0.19.0 (adapter lnk-hermes 0.1.0)" in created.err
    ok("agent", "start", "--agent", "work", home=home)
    assert chat(home, "hello hermes") == "tm heard hello hermes"
    assert chat(home, "and again") == "tm heard and again"
    # the proxy added the real key outside; Hermes, in the sandbox, held the placeholder
    assert model.keys() and set(model.keys()) == {f"Bearer {KEY}"}
    last = [r for r in model.requests if r["path"].endswith("/chat/completions")][-1]
    said = [m["content"] for m in last["body"]["messages"] if m["role"] == "user"]
    assert said[-2:] == ["hello hermes", "and again"]  # one Hermes session, resumed
    st = ok("agent", "status", "--agent", "work", "--json", home=home).json()
    assert st["state"] == "running" and st["sandboxed"] is True and st["harness"] == "hermes"
    logs = ok("agent", "logs", "--agent", "work", home=home).out
    assert "harness hermes 0.19.0 (adapter 0.1.0, contract 1)" in logs
    assert "lnk-hermes: Hermes answers at /run/lnk/net/endpoint.sock" in logs
    assert "configured again" in logs  # the first start wrote config.yaml and .env
    ok("agent", "stop", "--agent", "work", home=home)
    st = ok("agent", "status", "--agent", "work", "--json", home=home).json()
    assert st["state"] == "stopped"
    config = (hermes_home(home) / "config.yaml").stat()
    ok("agent", "start", "--agent", "work", home=home)  # nothing changed: nothing written
    logs = ok("agent", "logs", "--agent", "work", home=home).out
    assert "configuration unchanged (.lnk/configured)" in logs
    assert (hermes_home(home) / "config.yaml").stat().st_mtime_ns == config.st_mtime_ns
    ok("agent", "stop", "--agent", "work", home=home)
    # Hermes's own sessions in its state.db, in the agent's Agent/harness
    state = rows(home)
    assert len(state["sessions"]) == 1
    assert [(r, c) for _, r, c in state["messages"]] == [
        ("user", "hello hermes"),
        ("assistant", "tm heard hello hermes"),
        ("user", "and again"),
        ("assistant", "tm heard and again"),
    ]
    for f in hermes_home(home).rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f  # never the key on disk
    config = (hermes_home(home) / "config.yaml").read_text()
    assert "/.lnk/model/v1" in config and "lnk-placeholder" in config


def _configure(agent: registry.Agent, program: str, **change: Any) -> bool:
    req = setup.request(agent, True, agent.settings.endpoint_port + 1, Path("/tools"))
    req["install"] = {"root": "/tools/hermes", "harness": "0.19.0"}
    for k, v in change.items():
        req[k] = req[k] | v
    return Adapter("hermes", program).configure(req, agent.folders).changed


def test_configure_does_nothing_when_nothing_changed_and_runs_when_anything_did(
    hermes: Path, home: Path, tmp_path: Path
) -> None:
    model = ModelSettings(provider="openai", base_url="http://127.0.0.1:9/v1", name="m1")
    agent = registry.create(Machine.current(), "work", model=model, harness="hermes")
    (agent.folders.agent / "harness").mkdir()
    prog = shutil.which("lnk-hermes")
    assert prog is not None
    mark = hermes_home(home) / ".lnk" / "configured"
    assert _configure(agent, prog) is True
    first = mark.read_text()
    assert _configure(agent, prog) is False and mark.read_text() == first
    # the model changed
    assert _configure(agent, prog, model={"name": "m2"}) is True
    assert 'default: "m2"' in (hermes_home(home) / "config.yaml").read_text()
    assert _configure(agent, prog, model={"name": "m2"}) is False
    # the ports changed
    assert _configure(agent, prog, model={"name": "m2"}, ports={"endpoint": 30000}) is True
    assert _configure(agent, prog, model={"name": "m2"}, ports={"endpoint": 30000}) is False
    # Hermes (or a person) edited its config: lnk's settings win again
    config = hermes_home(home) / "config.yaml"
    config.write_text(config.read_text().replace("m2", "edited"))
    assert _configure(agent, prog, model={"name": "m2"}, ports={"endpoint": 30000}) is True
    assert "edited" not in config.read_text()
    # the adapter's release changed: a copy of the adapter, one line different
    pkg = tmp_path / "pkg"
    src = Path(__file__).resolve().parents[2] / "adapters" / "hermes" / "lnk_hermes"
    shutil.copytree(src, pkg / "lnk_hermes")
    init = pkg / "lnk_hermes" / "__init__.py"
    init.write_text(
        init.read_text().replace('ADAPTER_RELEASE = "0.1.0"', 'ADAPTER_RELEASE = "0.1.1"')
    )
    newer = tmp_path / "lnk-hermes"
    newer.write_text(f'#!/bin/sh\nPYTHONPATH={pkg} exec {sys.executable} -m lnk_hermes.cli "$@"\n')
    newer.chmod(0o755)
    same = {"model": {"name": "m2"}, "ports": {"endpoint": 30000}}
    assert _configure(agent, str(newer), **same) is True
    assert _configure(agent, str(newer), **same) is False
    assert _configure(agent, prog, **same) is True  # and back


def test_the_adapter_answers_the_contract_on_its_own(hermes: Path) -> None:
    def ask(cmd: str) -> dict[str, Any]:
        r = subprocess.run(
            ["lnk-hermes", cmd], input=b"{}", capture_output=True, timeout=60, env=os.environ
        )
        assert r.returncode == 0, r.stderr
        return dict(json.loads(r.stdout))

    assert ask("describe") == {
        "contract": 1,
        "name": "hermes",
        "adapter": "0.1.0",
        "harness": "0.19.0",
    }
    assert ask("needs") == {"needs": ["model", "harness-home", "tools"]}
    assert ask("internet-hosts") == {"hosts": ["pypi.org", "files.pythonhosted.org"]}
    assert ask("install")["root"] == str(hermes.resolve())
    r = subprocess.run(["lnk-hermes", "configure"], input=b"[]", capture_output=True, timeout=60)
    assert r.returncode == 1 and r.stderr.decode().count("\n") == 1


def test_a_hermes_agent_runs_without_its_sandbox_reading_the_key_from_its_variable(
    hermes: Path, model: ModelServer, home: Path
) -> None:
    create_hermes(home, model)
    ok("agent", "start", "--agent", "work", "--no-sandbox", home=home)
    try:
        assert chat(home, "unsandboxed") == "tm heard unsandboxed"
        assert model.keys()[-1] == f"Bearer {KEY}"  # from $TEST_KEY of the starting shell
        st = ok("agent", "status", "--agent", "work", "--json", home=home).json()
        assert st["sandboxed"] is False
        config = (hermes_home(home) / "config.yaml").read_text()
        assert model.base_url in config and 'api_key: "${TEST_KEY}"' in config  # no key
    finally:
        ok("agent", "stop", "--agent", "work", home=home)
    assert KEY.encode() not in (hermes_home(home) / ".env").read_bytes()


def test_a_stop_lets_a_running_hermes_turn_end_and_answer(
    hermes: Path, model: ModelServer, home: Path
) -> None:
    create_hermes(home, model)
    ok("agent", "start", "--agent", "work", home=home)
    model.gate = threading.Event()  # the model holds its answer until the stop is under way
    answers: list[str] = []
    chatting = threading.Thread(target=lambda: answers.append(chat(home, "slow")))
    chatting.start()
    wait_for(lambda: any("slow" in json.dumps(r.get("body")) for r in model.requests))
    stopping = threading.Thread(target=lambda: ok("agent", "stop", "--agent", "work", home=home))
    stopping.start()
    log = next((home / ".lnk" / "agents").glob("ag-*")) / "harness.log"
    wait_for(lambda: "lnk runner: stopping" in log.read_text())
    model.gate.set()
    chatting.join(120)
    stopping.join(120)
    assert answers == ["tm heard slow"]  # answered, not cut off by the stop
    said = [(role, text) for _, role, text in rows(home)["messages"]]
    assert said == [("user", "slow"), ("assistant", "tm heard slow")]


def wait_for(cond: Callable[[], bool]) -> None:
    """Until ``cond`` holds (each step a fraction of a second; a bound, never a timing)."""
    for _ in range(1200):
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("it never happened")
