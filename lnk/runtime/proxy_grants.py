"""What an agent runs with, and ``lnk agent allow`` / ``deny`` / ``secret`` behind the CLI.

The grants are edited through :data:`lnk.agents.grants.TABLE` and checked as
the sandbox would take them before the file is written, so a grant that
couldn't hold (a path under what the sandbox hides) is refused at once rather
than at the next start.  The proxy re-reads the file at each connection, so
hosts, ports, endpoints and LAN hosts hold at once; ``[files]`` and the
network mode at the agent's next start.
"""

from __future__ import annotations

from typing import Any

from lnk.agents import grants, secrets
from lnk.agents.registry import Agent
from lnk.errors import Refused, UsageError
from lnk.sandbox import limits
from lnk.sandbox.files import file_grants

AT_ONCE = ("host", "tcp", "port", "lan-host")


def change(agent: Agent, changes: list[tuple[str, str]], *, allow: bool) -> list[str]:
    """Allow or deny each (flag, value); returns a line per change, for the person."""
    if not changes:
        verb = "allow" if allow else "deny"
        raise UsageError(
            f"lnk agent {verb} needs at least one grant",
            hint=f"e.g. lnk agent {verb} --host api.example.com, see lnk agent {verb} --help",
        )
    path = agent.folders.sandbox_toml
    spec = grants.read_spec(path)
    notes: list[str] = []
    for flag, value in changes:
        f = grants.BY_FLAG.get(flag)
        if allow and f is not None and not f.enforced:
            raise Refused(
                f"this machine's sandbox can't hold --{flag}: a start would refuse {agent.name}",
                hint="nothing was changed; a grant this machine can't enforce is never given",
            )
        notes.append(grants.change(spec, flag, value, allow=allow))
    if agent.settings.sandbox:
        if allow:  # a new grant of a folder names one that exists
            new = {f: [v for g, v in changes if g == f] for f in ("read", "write")}
            file_grants(agent, new["read"], new["write"])
        # and the file as a whole is one the sandbox can hold (never what it hides)
        file_grants(agent, spec.read, spec.write, strict=False)
    grants.write_spec(path, spec)
    when = (
        "at once (the proxy re-reads them)"
        if all(f in AT_ONCE for f, _ in changes)
        else "at the agent's next start"
    )
    return [*notes, f"{path} written; it applies {when}"]


def permissions(agent: Agent) -> dict[str, Any]:
    """What every path of the agent runs with (``lnk agent show --permissions``)."""
    spec = grants.read_spec(agent.folders.sandbox_toml)
    m = agent.settings.model
    key_from = "none"
    if m.provider == "openai":
        if secrets.get(agent.machine, agent.id, m.key_env):
            key_from = f"secret {m.key_env} (added by the proxy)"
        else:
            key_from = f"variable {m.key_env} of the starting shell" + (
                " (added by the proxy)" if agent.settings.sandbox else ""
            )
    sandboxed = agent.settings.sandbox
    return {
        "agent": agent.name,
        "sandboxed": sandboxed,
        "file": str(agent.folders.sandbox_toml),
        "network": (
            "none (no sandbox: this machine's network)"
            if not sandboxed
            else "host (this machine's network as it is)"
            if spec.mode == "host"
            else "proxy"
        ),
        "hosts": spec.hosts,
        "ports": spec.ports,
        "tcp": spec.tcp,
        "lan": spec.lan,
        "files": {"read": spec.read, "write": spec.write},
        "limits": limits.held_here(agent.id, limits.Limits.of(spec)),
        "model": {"provider": m.provider, "base_url": m.base_url, "key": key_from},
        "flags": grants.as_flags(spec),
        "unenforceable": grants.unenforceable(spec),
    }


def set_secret(agent: Agent, name: str, value: str) -> None:
    secrets.set_secret(agent.machine, agent.id, name, value)
