"""``lnk agent allow / deny / show --permissions / secret``: what an agent may do, and its keys."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.cli.agent import agent, agent_option, json_option
from lnk.cli.output import emit_json, out, say
from lnk.errors import InvalidInput

F = TypeVar("F", bound=Callable[..., Any])

GRANT_FLAGS = (
    ("host", "a host, *.domain or * its proxy reaches (ports 80, 443)"),
    ("tcp", "an endpoint host:port reached on its port (a raw protocol)"),
    ("port", "a port of this machine's own (localhost)"),
    ("lan-host", "a host, address or network of your LAN"),
    ("read", "a folder it sees read-only (of its Home, or ~/x, /x)"),
    ("write", "a folder it may write (of its Home, or ~/x, /x)"),
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
@json_option
def show(agent_name: str | None, permissions: bool, as_json: bool) -> None:
    """Show the agent's permissions (its sandbox, proxy, hosts, files and model key)."""
    from lnk.runtime.proxy_grants import permissions as perms

    p = perms(registry.find(Machine.current(), agent_name))
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
def secret_set(agent_name: str | None, name: str, from_env: str | None) -> None:
    """Keep the key NAME (as [model] key_env names it) for the agent; the value from stdin."""
    from lnk.runtime.proxy_grants import set_secret

    a = registry.find(Machine.current(), agent_name)
    if from_env:
        if from_env not in os.environ:
            raise InvalidInput(f"the variable {from_env} is not set", hint=f"export {from_env}")
        value = os.environ[from_env]
    else:
        if sys.stdin.isatty():
            say(f"paste the value of {name} and press Enter:")
        value = sys.stdin.readline()
    set_secret(a, name, value)
    say(
        f"{name} kept for {a.name} in ~/.config/lnk/secrets (its proxy adds it; not in its sandbox)"
    )
