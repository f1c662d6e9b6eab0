"""A sandboxed agent behind its proxy, run by the real runner: its model, its key, its grants."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.settings import ModelSettings
from lnk.errors import LnkError
from lnk.harness import client
from lnk.harness.model import PLACEHOLDER_KEY
from lnk.runtime.runner import descendants
from lnk.sandbox.bwrap import check_bwrap, sandboxed
from tests.lnkrun import lnk
from tests.runtime.conftest import CA, Provider

REAL_KEY = "sk-real-0123456789abcdef"


def _agent(provider: Provider, key_env: str = "LNK_T_KEY") -> registry.Agent:
    model = ModelSettings(
        provider="openai", base_url=provider.base_url, name="tiny-1", key_env=key_env
    )
    a = registry.create(Machine.current(), "main", model=model)
    assert a.settings.sandbox is True
    return a


def _harness_pid(r: Any) -> int:
    leaves = [p for p in descendants(r.endpoint["harness_pid"]) if not descendants(p)]
    assert len(leaves) == 1, leaves
    return leaves[0]


def test_sandboxed_agent_answers_through_its_proxy_and_never_holds_the_key(
    start_agent: Any, provider: Provider, test_ca: CA, home: Path
) -> None:
    a = _agent(provider)
    # the README's way: the key kept outside, this machine's port granted by name
    assert lnk("agent", "secret", "set", "LNK_T_KEY", input=REAL_KEY + "\n").code == 0
    assert lnk("agent", "allow", "--port", str(provider.port)).code == 0
    perms = lnk("agent", "show", "--permissions", "--json").json()
    assert perms["ports"] == [provider.port] and perms["network"] == "proxy"
    assert perms["model"]["key"].startswith("secret LNK_T_KEY")
    secret_file = home / ".config" / "lnk" / "secrets" / f"{a.id}.toml"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    # the runner's proxy trusts the provider's test CA; nothing of the key in its environment
    r = start_agent(agent=a, env={"SSL_CERT_FILE": str(test_ca.ca_pem)})
    assert client.send_message(r.port, r.key, "link:main", "ping", timeout=60) == "heard ping"
    assert [q["auth"] for q in provider.requests] == [f"Bearer {REAL_KEY}"]
    assert provider.requests[0]["path"] == "/v1/chat/completions"
    # the harness holds only the placeholder: not the key in its environment...
    pid = _harness_pid(r)
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert REAL_KEY.encode() not in environ
    assert b"HTTPS_PROXY=http://127.0.0.1:" in environ
    assert b"LNK_T_KEY" not in environ
    # ... nor in any file it can read (its folders, /run/lnk, /tmp, /etc), where its config
    # names the proxy; the placeholder is what it sends
    where = [str(a.folders.root), "/run/lnk", "/tmp", "/etc", str(home)]
    grep = sandboxed(
        a,
        [
            "/bin/sh",
            "-c",
            f'grep -rlsF "$1" {" ".join(where)}; grep -c proxy_url /run/lnk/harness.json',
            "-",
            REAL_KEY,
        ],
        bwrap=check_bwrap(),
    )
    p = grep.run(capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "1", p.stdout  # no file holds the key; the config names the proxy
    assert PLACEHOLDER_KEY not in REAL_KEY
    log = (a.runtime / "harness.log").read_text()
    assert f"allowed model POST localhost:{provider.port}/v1/chat/completions (key added)" in log
    assert REAL_KEY not in log


def test_a_refused_host_is_in_the_log_and_in_status(
    start_agent: Any, provider: Provider, test_ca: CA
) -> None:
    a = _agent(provider)
    assert lnk("agent", "deny", "--host", "*").code == 0
    assert lnk("agent", "allow", "--host", "api.example.com", "--host", "localhost").code == 0
    r = start_agent(agent=a, env={"SSL_CERT_FILE": str(test_ca.ca_pem), "LNK_T_KEY": REAL_KEY})
    with pytest.raises(LnkError) as ei:
        client.send_message(r.port, r.key, "link:main", "ping", timeout=60)
    assert "403" in ei.value.message and "localhost is this machine" in ei.value.message
    assert provider.requests == []
    log = (a.runtime / "harness.log").read_text()
    assert f"refused model POST localhost:{provider.port}/v1/chat/completions: localhost" in log
    st = lnk("agent", "status")
    assert st.code == 0
    assert f"refused: localhost:{provider.port}" in st.out and f"--port {provider.port}" in st.out
    # a grant of this machine's port holds at once, without a restart
    assert lnk("agent", "allow", "--port", str(provider.port)).code == 0
    assert client.send_message(r.port, r.key, "link:main", "again", timeout=60) == "heard again"
    # the key came from the starting shell's variable, added outside
    assert provider.requests[-1]["auth"] == f"Bearer {REAL_KEY}"
    assert REAL_KEY.encode() not in Path(f"/proc/{_harness_pid(r)}/environ").read_bytes()


def test_an_unenforceable_section_refuses_start(home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    a.folders.sandbox_toml.write_text('[files]\nwrite = ["."]\n[commands]\nallow = ["git"]\n')
    p = lnk("agent", "start")
    assert p.code != 0
    lines = p.err.strip().splitlines()
    assert lines[0].startswith("lnk: error: ") and "[commands] allow" in lines[0], p.err
    assert "can't enforce" in lines[0]
    assert all(x.startswith("lnk: ") for x in lines)
    assert not (a.runtime / "endpoint.json").exists()
    shown = lnk("agent", "show", "--permissions")
    assert "refused at start (not enforceable here): [commands] allow" in shown.out


def test_read_and_write_grants_become_binds_and_never_show_what_is_hidden(home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("secret")
    (home / "docs").mkdir()
    (home / "docs" / "a.txt").write_text("doc\n")
    (home / "out").mkdir()
    (a.folders.home / "work").mkdir()
    assert lnk("agent", "allow", "--read", "~/docs", "--write", "~/out", "--read", "work").code == 0
    # what the layout hides stays hidden, whatever a grant says
    for bad in ("~/.ssh", "~/.ssh/id_ed25519", "~/.config", "~/.lnk"):
        p = lnk("agent", "allow", "--read", bad)
        assert p.code != 0 and "hides" in p.err, p.err
    (home / "sneaky").symlink_to(home / ".ssh")
    p = lnk("agent", "allow", "--write", "~/sneaky")
    assert p.code != 0 and "hides" in p.err
    # a grant of all of ~ shows it read-only, with ~/.ssh and ~/.config covered
    assert lnk("agent", "allow", "--read", "~").code == 0
    from lnk.agents.grants import read_spec

    spec = read_spec(a.folders.sandbox_toml)
    argv = sandboxed(
        a,
        [
            "/bin/sh",
            "-c",
            f"cat {home}/docs/a.txt; touch {home}/docs/b 2>/dev/null && echo docs-writable; "
            f"touch {home}/out/c && echo out-writable; "
            f"touch {a.folders.home}/work/x 2>/dev/null && echo work-writable; "
            f"touch {a.folders.home}/y && echo home-writable; "
            f"ls -A {home}/.ssh; test -e {home}/.ssh/id_ed25519 && echo SSH-VISIBLE; "
            f"test -e {home}/.config/lnk && echo CONFIG-VISIBLE; echo end",
        ],
        bwrap=check_bwrap(),
        runtime=False,
        files=(spec.read, spec.write),
    )
    p = argv.run(capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["doc", "out-writable", "home-writable", "end"], p.stdout
    assert (home / "out" / "c").exists() and not (home / "docs" / "b").exists()
    assert (home / ".ssh" / "id_ed25519").read_text() == "secret"


def test_network_mode_host_shares_the_network(home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    assert lnk("agent", "allow", "--network-mode", "host").code == 0
    argv = sandboxed(
        a,
        [sys.executable, "-c", "import socket; print(len(socket.if_nameindex()) > 1)"],
        bwrap=check_bwrap(),
        runtime=False,
        network_mode="host",
    )
    assert argv.run(capture_output=True, text=True, timeout=60).stdout.strip() == "True"
    assert "host" in lnk("agent", "show", "--permissions", "--json").json()["network"]
    assert lnk("agent", "deny", "--network-mode", "host").code == 0
    assert lnk("agent", "show", "--permissions", "--json").json()["network"] == "proxy"


def test_network_mode_host_keeps_the_key_outside(
    start_agent: Any, provider: Provider, test_ca: CA
) -> None:
    a = _agent(provider)
    assert lnk("agent", "allow", "--network-mode", "host").code == 0
    r = start_agent(agent=a, env={"SSL_CERT_FILE": str(test_ca.ca_pem), "LNK_T_KEY": REAL_KEY})
    assert client.send_message(r.port, r.key, "link:main", "ping", timeout=60) == "heard ping"
    assert provider.requests[-1]["auth"] == f"Bearer {REAL_KEY}"
    pid = _harness_pid(r)
    assert os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert REAL_KEY.encode() not in environ and b"HTTPS_PROXY" not in environ


def test_a_host_not_on_the_list_is_refused_in_the_log_and_status(start_agent: Any) -> None:
    model = ModelSettings(provider="openai", base_url="https://11.0.0.9/v1", name="m")
    a = registry.create(Machine.current(), "main", model=model)
    assert lnk("agent", "deny", "--host", "*").code == 0
    assert lnk("agent", "allow", "--host", "api.example.com").code == 0
    r = start_agent(agent=a)
    with pytest.raises(LnkError) as ei:
        client.send_message(r.port, r.key, "link:main", "ping", timeout=60)
    assert "403" in ei.value.message
    why = "11.0.0.9 is not on the agent's [internet] hosts (--host 11.0.0.9)"
    assert why in ei.value.message
    log = (a.runtime / "harness.log").read_text()
    assert f"lnk proxy: refused model POST 11.0.0.9:443/v1/chat/completions: {why}" in log
    st = lnk("agent", "status", "--json").json()
    assert st["refused"]["host"] == "11.0.0.9" and st["refused"]["port"] == 443
    assert why in lnk("agent", "status").out


def test_secret_set_keeps_the_key_outside_and_refuses_what_is_not_one(home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    p = lnk(
        "agent",
        "secret",
        "set",
        "OPENAI_API_KEY",
        "--from-env",
        "LNK_T_SRC",
        env={"LNK_T_SRC": REAL_KEY},
    )
    assert p.code == 0, p.err
    f = home / ".config" / "lnk" / "secrets" / f"{a.id}.toml"
    assert REAL_KEY in f.read_text() and f.stat().st_mode & 0o777 == 0o600
    assert (f.parent.stat().st_mode & 0o777) == 0o700
    assert REAL_KEY not in p.out + p.err
    for args, why in (
        (("BAD-NAME",), "not a secret's name"),
        (("K", "--from-env", "LNK_T_UNSET"), "LNK_T_UNSET is not set"),
        (("K",), "empty"),
    ):
        q = lnk("agent", "secret", "set", *args, input="")
        assert q.code != 0 and q.err.startswith("lnk: error: ") and why in q.err, q.err
    # the sandbox shows nothing of ~/.config
    argv = sandboxed(a, ["/bin/sh", "-c", f"test -e {f}"], bwrap=check_bwrap(), runtime=False)
    assert argv.run(timeout=60).returncode == 1
