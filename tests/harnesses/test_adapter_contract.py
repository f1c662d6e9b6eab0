"""The adapter contract's refusals: a fake adapter, lnk-evil on PATH, answering each bad
thing an adapter could say; each is refused with one error, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lnkrun import lnk

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.settings import ModelSettings
from lnk.errors import LnkError, NotFound, Refused
from lnk.harnesses import builtin, setup
from lnk.harnesses import contract as C
from lnk.harnesses.adapter import Adapter

# one program: what it answers is chosen by EVIL (a JSON text printed as it is, or a mode)
EVIL = r"""#!/usr/bin/env python3
import json, os, sys, time
cmd, mode = sys.argv[1], os.environ.get("EVIL", "")
sys.stdin.read()
good = {
    "describe": {"contract": 1, "name": "evil", "adapter": "1", "harness": "1"},
    "needs": {"needs": []},
    "internet-hosts": {"hosts": []},
    "install": {"root": "/usr", "harness": "1"},
    "configure": {"changed": True, "home": os.environ["EVIL_HOME"]},
    "state": {"paths": [{"path": "Agent/harness/state.db", "kind": "sqlite"}]},
    "endpoint": {"argv": ["/bin/true"], "env": {}, "read": [], "write": [], "proof": True},
}
if mode == "huge" and cmd == os.environ.get("EVIL_CMD"):
    sys.stdout.write("[" + "1," * (2 << 20) + "1]")
elif mode == "slow" and cmd == os.environ.get("EVIL_CMD"):
    time.sleep(30)
elif mode == "fetch" and cmd == "install":  # what its proxy lets it reach
    import urllib.request
    for url in os.environ["EVIL_URLS"].split():
        try:
            urllib.request.urlopen(url, timeout=20).read()
            print("reached", url, file=sys.stderr)
        except Exception as e:
            print("refused", url, getattr(e, "code", e), file=sys.stderr)
    print("proxy", os.environ.get("HTTPS_PROXY", "none"), os.environ.get("NO_PROXY"), file=sys.stderr)
    sys.exit(9)
elif mode == "fail" and cmd == os.environ.get("EVIL_CMD"):
    sys.stderr.write("progress line\n" * 10000 + "it broke \x1b]52;c;aGk=\x07 here\n")
    sys.exit(3)
elif mode == "notjson" and cmd == os.environ.get("EVIL_CMD"):
    print("hello, I am not JSON")
elif mode and cmd == os.environ.get("EVIL_CMD"):
    sys.stdout.write(mode)
else:
    print(json.dumps(good[cmd]))
"""


@pytest.fixture
def evil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path) -> registry.Agent:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    prog = bin_dir / "lnk-evil"
    prog.write_text(EVIL)
    prog.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    model = ModelSettings(provider="openai", base_url="http://127.0.0.1:9/v1", name="m")
    agent = registry.create(Machine.current(), "work", model=model, harness="evil")
    (agent.folders.agent / "harness").mkdir()
    monkeypatch.setenv("EVIL_HOME", str(agent.folders.agent / "harness"))
    return agent


def answer(monkeypatch: pytest.MonkeyPatch, cmd: str, text: str) -> None:
    monkeypatch.setenv("EVIL_CMD", cmd)
    monkeypatch.setenv("EVIL", text)


def start(agent: registry.Agent) -> setup.Started:
    return setup.prepare(agent, True, agent.settings.endpoint_port + 1, {"unix": "/x"}, "/k")


def test_a_good_adapter_is_read_into_typed_answers(evil: registry.Agent) -> None:
    started = start(evil)
    assert started.describe == C.Describe("evil", "1", "1", 1)
    assert started.endpoint.argv == ("/bin/true",)
    assert setup.state(evil).paths == (C.StatePath("Agent/harness/state.db", "sqlite"),)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "not a plain relative path"),
        ("Agent/harness/../../../../etc/passwd", "not a plain relative path"),
        ("Config/sandbox.toml", "outside the agent's folders"),
        ("Agent/harness/link/passwd", "symbolic link"),
        ("Agent/harness/state\x1b]52;c;aGk=\x07.db", "control character"),
    ],
)
def test_a_state_path_outside_up_through_a_link_or_with_escapes_is_refused(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch, path: str, why: str
) -> None:
    (evil.folders.agent / "harness" / "link").symlink_to("/etc")
    answer(monkeypatch, "state", json.dumps({"paths": [{"path": path, "kind": "file"}]}))
    with pytest.raises(C.AdapterError, match=why) as e:
        setup.state(evil)
    assert "lnk-evil answered state wrongly" in e.value.message


@pytest.mark.parametrize(
    ("cmd", "text", "why"),
    [
        ("describe", "huge", "over 1048576 bytes"),
        ("describe", "notjson", "not one JSON object"),
        (
            "describe",
            '{"contract": 1, "name": "evil\\u001b[2J", "adapter": "1", "harness": "1"}',
            "control character",
        ),
        (
            "describe",
            '{"contract": 1, "name": "evil", "adapter": "\\u009b31m", "harness": "1"}',
            "control character",
        ),
        (
            "describe",
            '{"contract": 1, "name": "evil", "adapter": "\\u202e1", "harness": "1"}',
            "control character",
        ),
        (
            "describe",
            '{"contract": 2, "name": "evil", "adapter": "1", "harness": "1"}',
            "speaks contract 2",
        ),
        (
            "describe",
            '{"contract": 1, "name": "hermes", "adapter": "1", "harness": "1"}',
            "names itself",
        ),
        ("install", '{"root": "relative/dir", "harness": "1"}', "not an absolute path"),
        ("configure", '{"changed": true, "home": "/etc"}', "outside the agent's"),
        ("endpoint", '{"argv": ["/bin/true"], "write": ["/tmp"], "proof": true}', "outside"),
        ("endpoint", '{"argv": ["/bin/true"], "read": ["/"], "proof": true}', "all of HOME"),
        ("endpoint", '{"argv": ["/bin/true"], "read": ["/proc"], "proof": true}', "host's"),
        ("endpoint", '{"argv": ["/bin/true"], "read": ["/proc/1"], "proof": true}', "host's"),
        ("endpoint", '{"argv": ["/bin/true"], "read": ["/run/user"], "proof": true}', "host's"),
        ("endpoint", '{"argv": ["/bin/true"], "read": ["/tmp"], "proof": true}', "host's"),
        ("endpoint", '{"argv": ["sh"], "proof": true}', "absolute program path"),
        ("endpoint", '{"argv": ["/bin/true"], "env": {"A B": "1"}, "proof": true}', "NAME"),
    ],
)
def test_each_bad_answer_is_refused_with_one_error(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch, cmd: str, text: str, why: str
) -> None:
    answer(monkeypatch, cmd, text)
    with pytest.raises(LnkError, match=why) as e:
        start(evil)
    assert "\n" not in e.value.message and "\x1b" not in e.value.message


def test_an_endpoint_reading_home_or_another_agent_is_refused(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    for read in (home / ".ssh", evil.folders.root.parent):
        read.mkdir(parents=True, exist_ok=True)
        answer(
            monkeypatch,
            "endpoint",
            json.dumps({"argv": ["/bin/true"], "read": [str(read)], "proof": True}),
        )
        with pytest.raises(C.AdapterError, match="read"):
            start(evil)


def test_an_answer_too_slow_is_refused(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer(monkeypatch, "needs", "slow")
    with pytest.raises(C.AdapterError, match="no answer within 1s"):
        Adapter.find("evil").ask("needs", {}, timeout=1)


def test_a_need_lnk_cannot_grant_refuses_the_start_naming_it(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer(monkeypatch, "needs", '{"needs": ["host-network", "model"]}')
    with pytest.raises(Refused, match="needs host-network, which"):
        start(evil)


def test_an_endpoint_without_the_proof_is_refused(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer(monkeypatch, "endpoint", '{"argv": ["/bin/true"], "proof": false}')
    with pytest.raises(Refused, match="endpoint proof"):
        start(evil)


def test_a_missing_adapter_and_a_bad_name_are_refused(home: Path) -> None:
    with pytest.raises(NotFound, match="lnk-nosuch is not on PATH"):
        Adapter.find("nosuch")
    with pytest.raises(LnkError, match="lowercase"):
        Adapter.find("../x")


def test_the_command_line_shows_one_error_line_never_a_traceback(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    answer(monkeypatch, "describe", '{"contract": 1, "name": "evil\\u001b]52;c;aGk=\\u0007"}')
    r = lnk("agent", "create", "other", "--harness", "evil", home=home)
    assert r.code != 0
    errors = [line for line in r.err.splitlines() if line.startswith("lnk: error:")]
    assert len(errors) == 1 and "control character" in errors[0], r.err
    assert "Traceback" not in r.err and "\x1b" not in r.err
    assert not (home / "Link" / "Agents" / "other").exists()


def test_a_backup_of_an_agent_whose_adapter_names_a_state_path_outside_is_refused(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    answer(monkeypatch, "state", json.dumps({"paths": [{"path": "../../.ssh", "kind": "dir"}]}))
    r = lnk("agent", "backup", "--agent", "work", "--to", f"file://{bucket}", home=home)
    assert r.code != 0
    errors = [line for line in r.err.splitlines() if line.startswith("lnk: error:")]
    assert len(errors) == 1 and "answered state wrongly" in errors[0], r.err
    assert "Traceback" not in r.err
    answer(monkeypatch, "state", "")  # the good answer: backed up
    r = lnk("agent", "backup", "--agent", "work", "--to", f"file://{bucket}", home=home)
    assert r.code == 0, r.err


def test_settings_naming_a_harness_that_is_no_name_are_refused(
    evil: registry.Agent, home: Path
) -> None:
    path = evil.settings_path
    path.write_text(path.read_text().replace('harness = "evil"', 'harness = "../../bin/sh"'))
    r = lnk("agent", "status", "--agent", "work", home=home)
    assert r.code != 0 and "Traceback" not in r.err
    errors = [line for line in r.err.splitlines() if line.startswith("lnk: error:")]
    assert len(errors) == 1 and "not a harness name" in errors[0], r.err


def test_link_s_own_harness_answers_the_same_questions_in_process(home: Path) -> None:
    agent = registry.create(Machine.current(), "mine")
    d = builtin.describe()
    assert (d.name, d.contract) == ("builtin", C.CONTRACT_VERSION) and d.adapter == d.harness
    state = setup.checked_state(agent)
    assert state is not None and C.StatePath("Home", "dir") in state.paths
    assert C.StatePath("Agent/chats", "dir") in state.paths
    assert builtin.needs() == C.Needs(("model",)) and builtin.internet_hosts().hosts == ()


def test_a_failing_command_is_one_error_with_its_last_line_escaped(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer(monkeypatch, "install", "fail")
    with pytest.raises(LnkError) as e:
        start(evil)
    assert e.value.message.startswith("lnk-evil install failed (exit 3): it broke")
    assert "\x1b" not in e.value.message and "\n" not in e.value.message
    assert "progress line" not in e.value.message


def test_an_install_reaches_only_the_hosts_its_adapter_lists(
    evil: registry.Agent, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The runner's install goes through a proxy granting internet-hosts alone: this
    machine's servers (here, a ModelServer) are refused to it."""
    from servers import ModelServer

    from lnk.runtime import adapted

    server = ModelServer("local")
    try:
        monkeypatch.setenv("EVIL", "fetch")
        monkeypatch.setenv("EVIL_URLS", f"{server.base_url}/models http://example.invalid/")
        with pytest.raises(LnkError, match="install failed") as e:
            adapted.prepare(evil, True)
        assert server.requests == []  # never reached
        log = e.value.message
        assert "proxy http://127.0.0.1:" in log and "None" not in log, log
    finally:
        server.stop()
