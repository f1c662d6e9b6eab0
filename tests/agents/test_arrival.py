"""The receiving machine decides, the stream informs (lnk.agents.policy).

A stream or a snapshot written on a box asks for no sandbox, a model at a URL
of its choosing and a key variable holding a secret, and wide grants.  Where it
arrives, the agent runs sandboxed, with that machine's own model, and every
item not taken is named with the command that would give it here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lnkrun import lnk, ok
from move_helpers import kill_agents
from trust_helpers import (
    AGENT,
    SECRET,
    Listener,
    grants_file,
    hostile_agent,
    read_settings,
    send_stream,
)


@pytest.fixture
def listener() -> Listener:
    return Listener()


def _check_arrived(home: Path, listener: Listener, err: str, report: dict) -> None:
    # the settings written here: sandboxed, this machine's own model
    s = read_settings(home)
    assert s["sandbox"] is True
    assert s["model"]["provider"] == "offline"
    assert str(listener.port) not in str(s["model"]) and "MY_GITHUB_TOKEN" not in str(s)
    # the wide grants are dropped, the narrow ones kept
    g = grants_file(home).read_text()
    assert '"~"' not in g and "host" not in g and "5432" not in g and "docs" in g
    # every item not taken is named, in the JSON and as the command that gives it here
    kept = {k["setting"]: k for k in report["kept_here"]}
    assert kept["sandbox"]["restore"] == f"lnk agent start --no-sandbox --agent {AGENT}"
    assert "MY_GITHUB_TOKEN" in kept["model"]["stream"] and kept["model"]["here"].startswith(
        "offline"
    )
    assert {"--read '~'", "--network-mode host", "--port 5432"} <= set(report["dropped_grants"])
    assert f"lnk agent start --no-sandbox --agent {AGENT}" in err
    assert f"lnk agent allow --read '~' --agent {AGENT}" in err
    assert f"lnk agent allow --network-mode host --agent {AGENT}" in err
    assert f"lnk agent allow --port 5432 --agent {AGENT}" in err
    assert "kept this machine's model" in err
    # it runs sandboxed, and its chat never reaches the stream's URL with the secret
    env = {"MY_GITHUB_TOKEN": SECRET}
    try:
        st = ok("agent", "start", "--agent", AGENT, "--json", home=home, env=env).json()
        assert st["sandboxed"] is True
        r = ok("agent", "chat", "send", "--agent", AGENT, "hello", home=home, env=env)
        assert "you said: hello" in r.out
        assert listener.connections() == 0
    finally:
        lnk("agent", "stop", "--agent", AGENT, home=home)
        kill_agents([home])


def test_hostile_settings_stream_arrives_sandboxed_with_this_machines_model(
    home: Path, tmp_path: Path, listener: Listener
) -> None:
    box = tmp_path / "box"
    hostile_agent(box, listener.port)
    prep = ok("agent", "state-receive", "--prepare", "--json").json()
    stream = tmp_path / "stream"
    send_stream(box, prep["public_key"], stream)
    r = ok(
        "agent",
        "state-receive",
        "--receiver",
        prep["receiver"],
        "--json",
        input=stream.read_bytes(),
    )
    report = r.json()
    assert report["committed"] and report["grants_from"] == "stream"
    _check_arrived(home, listener, r.err, report)


def test_hostile_settings_snapshot_restores_sandboxed_with_this_machines_model(
    home: Path, tmp_path: Path, listener: Listener
) -> None:
    box = tmp_path / "box"
    hostile_agent(box, listener.port)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = f"file://{bucket}"
    ok("agent", "backup", "--agent", AGENT, "--to", url, home=box)
    ok("backup", "key", "import", input=ok("backup", "key", "export", home=box).out)
    plain = ok("agent", "restore", AGENT, "--from", url)
    assert f"lnk agent start --no-sandbox --agent {AGENT}" in plain.err
    # the same through --json, on a machine of its own
    other = tmp_path / "other"
    other.mkdir()
    ok("backup", "key", "import", input=ok("backup", "key", "export", home=box).out, home=other)
    report = ok("agent", "restore", AGENT, "--from", url, "--json", home=other).json()
    _check_arrived(home, listener, plain.err, report)
    assert read_settings(other)["sandbox"] is True
    assert read_settings(other)["model"]["provider"] == "offline"


def test_a_stream_never_turns_the_sandbox_off_of_an_agent_living_here(
    home: Path, tmp_path: Path, listener: Listener
) -> None:
    """An agent that lives here keeps its own switch, model and grants (--force restore)."""
    box = tmp_path / "box"
    hostile_agent(box, listener.port)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = f"file://{bucket}"
    ok("agent", "backup", "--agent", AGENT, "--to", url, home=box)
    ok("backup", "key", "import", input=ok("backup", "key", "export", home=box).out)
    ok("agent", "restore", AGENT, "--from", url)
    grants_file(home).write_text('[files]\nwrite = ["."]\nread = ["~"]\n')
    r = ok("agent", "restore", AGENT, "--from", url, "--force", "--json")
    assert r.json()["dropped_grants"] == []
    assert read_settings(home)["sandbox"] is True
    assert 'read = ["~"]' in grants_file(home).read_text()
