"""``lnk agent allow / deny / show --permissions / secret``: what an agent may do, and its keys."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from lnk.agents import registry, secrets
from lnk.agents.layout import Machine
from lnk.cli.agent import agent, agent_option, json_option
from lnk.cli.output import emit_json, out, say
from lnk.errors import InvalidInput, NotFound, UsageError

F = TypeVar("F", bound=Callable[..., Any])

GRANT_FLAGS = (
    ("host", "a host, *.domain or * its proxy reaches (ports 80, 443)"),
    ("tcp", "an endpoint host:port reached on its port (a raw protocol)"),
    ("port", "a port of this machine's own (localhost)"),
    ("lan-host", "a host, address or network of your LAN"),
    ("read", "a folder it sees read-only (of its Home, or ~/x, /x)"),
    ("write", "a folder it may write (of its Home, or ~/x, /x)"),
    ("command", "a program it may run (Linux's sandbox can't hold it: a start refuses it)"),
    ("tool", "a tool that runs outside its sandbox (a start refuses it here)"),
    ("browser-host", "your browser, at this host (a start refuses it here)"),
    ("memory", "the most memory its sandbox may use (e.g. 4G; deny: this machine's default)"),
    ("processes", "the most processes its sandbox may run"),
    ("open-files", "the most files its sandbox may hold open"),
)


def _grant_options(f: F) -> F:
    for flag, why in reversed(GRANT_FLAGS):
        f = click.option(f"--{flag}", flag.replace("-", "_"), multiple=True, help=why)(f)
    out_: F = click.option(
        "--network-mode",
        "network_mode",
        type=click.Choice(["host"]),
        default=None,
        help="this machine's network as it is, without its proxy",
    )(f)
    return out_


def _changes(kw: dict[str, object]) -> list[tuple[str, str]]:
    out_: list[tuple[str, str]] = []
    for flag, _ in GRANT_FLAGS:
        for v in kw.get(flag.replace("-", "_")) or ():  # type: ignore[attr-defined]
            out_.append((flag, str(v)))
    if kw.get("network_mode"):
        out_.append(("network-mode", str(kw["network_mode"])))
    return out_


def _edit(agent_name: str | None, allow: bool, kw: dict[str, object]) -> None:
    from lnk.runtime.proxy_grants import change

    a = registry.find(Machine.current(), agent_name)
    for line in change(a, _changes(kw), allow=allow):
        say(line)


@agent.command()
@agent_option
@_grant_options
def allow(agent_name: str | None, **kw: object) -> None:
    """Grant the agent a host, endpoint, port, LAN host, folder or the host network."""
    _edit(agent_name, True, kw)


@agent.command()
@agent_option
@_grant_options
def deny(agent_name: str | None, **kw: object) -> None:
    """Take a grant back (a host still matched by a wider one is denied by name)."""
    _edit(agent_name, False, kw)


@agent.command()
@agent_option
@click.option("--permissions", is_flag=True, help="what the agent runs with: its grants")
@click.option("--grants", "raw_grants", is_flag=True, help="its grants file as it is (TOML)")
@json_option
def show(agent_name: str | None, permissions: bool, raw_grants: bool, as_json: bool) -> None:
    """Show the agent's permissions (its sandbox, proxy, hosts, files and model key)."""
    from lnk.runtime.proxy_grants import permissions as perms

    a = registry.find(Machine.current(), agent_name)
    if raw_grants:
        with contextlib.suppress(FileNotFoundError):
            sys.stdout.write(a.folders.sandbox_toml.read_text())
        return
    p = perms(a)
    if as_json:
        emit_json(p)
        return
    out(f"agent: {p['agent']}")
    out(f"sandbox: {'on' if p['sandboxed'] else 'off'}")
    out(f"network: {p['network']}")
    if p["sandboxed"]:
        out(f"hosts: {' '.join(p['hosts']) or '(none)'}")
        out(f"tcp: {' '.join(p['tcp']) or '(none)'}")
        out(f"ports of this machine: {' '.join(map(str, p['ports'])) or '(none)'}")
        out(f"lan: {' '.join(p['lan']) or '(none)'}")
        out(f"files read: {' '.join(p['files']['read']) or '(none)'}")
        out(f"files write: {' '.join(p['files']['write']) or '(none)'}")
        out(f"limits: {'; '.join(p['limits'])}")
    out(f"model: {p['model']['provider']} {p['model']['base_url']}".rstrip())
    out(f"model key: {p['model']['key']}")
    if p["unenforceable"]:
        out(f"refused at start (not enforceable here): {', '.join(p['unenforceable'])}")
    out(f"file: {p['file']}")


@agent.group()
def secret() -> None:
    """An agent's provider keys, kept outside every sandbox."""


@secret.command("set")
@agent_option
@click.argument("name")
@click.option("--from-env", "from_env", metavar="VAR", help="take the value from this variable")
@click.option("--agent-id", "agent_id", metavar="ID", hidden=True, help="an agent not here yet")
def secret_set(
    agent_name: str | None, name: str, from_env: str | None, agent_id: str | None
) -> None:
    """Keep the key NAME (as [model] key_env names it) for the agent; the value from stdin."""
    m, aid, who = _secret_agent(agent_name, agent_id)
    if from_env:
        if from_env not in os.environ:
            raise InvalidInput(f"the variable {from_env} is not set", hint=f"export {from_env}")
        value = os.environ[from_env]
    else:
        if sys.stdin.isatty():
            say(f"paste the value of {name} and press Enter:")
        value = sys.stdin.readline()
    secrets.set_secret(m, aid, name, value)
    say(f"{name} kept for {who} in ~/.config/lnk/secrets (its proxy adds it; not in its sandbox)")


def _secret_agent(agent_name: str | None, agent_id: str | None) -> tuple[Machine, str, str]:
    """(machine, ID, what to call it): by --agent-id (a box, before the agent is there) or
    by --agent."""
    m = Machine.current()
    if agent_id is not None:
        return m, agent_id, agent_id
    a = registry.find(m, agent_name)
    return m, a.id, a.name


@secret.command("list")
@agent_option
@json_option
def secret_list(agent_name: str | None, as_json: bool) -> None:
    """The names of the agent's keys (never their values)."""
    m, aid, who = _secret_agent(agent_name, None)
    found = secrets.names(m, aid)
    if as_json:
        emit_json({"agent": who, "secrets": found})
        return
    if not found:
        say(f"{who} has no secrets here")
    for name in found:
        out(name)


@secret.command("remove")
@agent_option
@click.argument("name")
def secret_remove(agent_name: str | None, name: str) -> None:
    """Forget the agent's key NAME here."""
    m, aid, who = _secret_agent(agent_name, None)
    if not secrets.remove(m, aid, secrets.check_name(name)):
        raise NotFound(
            f"{who} has no secret {name} here", hint=f"lnk agent secret list --agent {who}"
        )
    say(f"{name} forgotten for {who}")


# --- what a move runs at each end (docs/boxes.md): a key pair never leaves a leg's pipe ----
@secret.command("export", hidden=True)
@click.option("--agent-id", "agent_id", metavar="ID", required=True)
def secret_export(agent_id: str) -> None:
    """Every key of the agent, as JSON on stdout: piped by a move into the other end's
    import (never a stream, never a terminal)."""
    if sys.stdout.isatty():
        raise UsageError("secret export writes keys: pipe it", hint="a move runs it; you don't")
    sys.stdout.write(json.dumps(secrets.export(Machine.current(), agent_id)))


@secret.command("import", hidden=True)
@click.option("--agent-id", "agent_id", metavar="ID", required=True)
def secret_import(agent_id: str) -> None:
    """Keep the keys an export sent (JSON on stdin) for the agent, before it arrives."""
    raw = sys.stdin.buffer.read(256 * 1024 + 1)
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise InvalidInput("the secrets sent are not JSON", hint="a move sends them") from e
    for name in secrets.import_all(Machine.current(), agent_id, doc):
        say(f"kept {name}")


@secret.command("forget", hidden=True)
@click.option("--agent-id", "agent_id", metavar="ID", required=True)
def secret_forget(agent_id: str) -> None:
    """Forget every key of the agent here (a move undone, or the agent gone)."""
    secrets.remove_all(Machine.current(), agent_id)
