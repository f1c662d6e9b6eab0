"""One start of an adapter's harness, through the contract: describe, needs, install,
configure, endpoint, each answer checked (:mod:`lnk.harnesses.contract`).

What a start hands the adapter is what lnk knows of the agent and nothing secret:
its ID, name and owner, its folders, its ports, and its model as the harness
should ask it (sandboxed: the agent's proxy's model route with a placeholder
key; the proxy adds the real key outside the sandbox).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnk.agents.registry import Agent
from lnk.errors import NotFound, Refused
from lnk.harnesses import builtin
from lnk.harnesses import contract as C
from lnk.harnesses.adapter import Adapter

PLACEHOLDER_KEY = "lnk-placeholder-the-proxy-adds-the-key"  # as Link Harness's
MODEL_ROUTE = "/.lnk/model"  # the proxy's model route (lnk.runtime.model_route.PREFIX)


def tools_dir(agent: Agent, harness: str) -> Path:
    """Where this machine installs a harness: never carried by a move or a backup."""
    return agent.machine.state_dir / "tools" / harness


def model_for(agent: Agent, sandboxed: bool, proxy_port: int) -> dict[str, Any]:
    m = agent.settings.model
    url = m.base_url
    if sandboxed and m.provider == "openai" and url:
        path = url.split("://", 1)[-1].partition("/")[2].rstrip("/")
        url = f"http://127.0.0.1:{proxy_port}{MODEL_ROUTE}" + (f"/{path}" if path else "")
    return {
        "provider": m.provider,
        "name": m.name,
        "base_url": url,
        # sandboxed, the harness never holds the key; unsandboxed, it reads the variable
        "key": PLACEHOLDER_KEY if sandboxed else "",
        "key_env": "" if sandboxed else m.key_env,
    }


def request(agent: Agent, sandboxed: bool, proxy_port: int, tools: Path) -> dict[str, Any]:
    s, f = agent.settings, agent.folders
    return {
        "contract": C.CONTRACT_VERSION,
        "agent": {"id": s.id, "name": s.name, "owner": s.owner},
        "folders": {
            "root": str(f.root),
            "home": str(f.home),
            "agent": str(f.agent),
            "harness": str(f.agent / C.HARNESS_DIR),
        },
        "model": model_for(agent, sandboxed, proxy_port),
        "ports": {
            "base": s.port_base,
            "count": s.port_count,
            "endpoint": s.endpoint_port,
            "proxy": proxy_port,
        },
        "sandboxed": sandboxed,
        "tools": str(tools),
    }


@dataclass(frozen=True)
class Started:
    """What lnk runs for an adapter's harness, all of it checked."""

    describe: C.Describe
    installed: C.Installed
    configured: C.Configured
    endpoint: C.Endpoint


def check_needs(adapter: Adapter, needs: C.Needs, sandboxed: bool) -> None:
    """A start that can't grant what the harness needs refuses, naming it."""
    unknown = [n for n in needs.needs if n not in C.KNOWN_NEEDS]
    if unknown and sandboxed:
        raise Refused(
            f"the harness {adapter.harness} needs {', '.join(unknown)}, which this lnk's "
            f"sandbox can't grant (it grants {', '.join(C.KNOWN_NEEDS)})",
            hint="update lnk, or run the agent without its sandbox on a machine you trust "
            "(lnk agent start --no-sandbox)",
        )


InstallEnv = Callable[[C.Hosts], AbstractContextManager[dict[str, str]]]


def prepare(
    agent: Agent,
    sandboxed: bool,
    proxy_port: int,
    listen: dict[str, Any],
    key_file: str,
    install_env: InstallEnv | None = None,
) -> Started:
    """Ask the agent's adapter everything a start needs, in the contract's order.

    ``install_env`` gives the install's environment for the hosts the adapter lists (the
    runtime's: a proxy reaching those alone)."""
    adapter = Adapter.find(agent.settings.harness)
    described = adapter.describe()
    check_needs(adapter, adapter.needs(), sandboxed)
    hosts = adapter.internet_hosts()
    tools = tools_dir(agent, adapter.harness)
    tools.mkdir(parents=True, exist_ok=True, mode=0o700)
    with install_env(hosts) if install_env is not None else nullcontext({}) as env:
        installed = adapter.install(tools, env)
    req = request(agent, sandboxed, proxy_port, tools)
    req["install"] = {"root": installed.root, "harness": installed.harness}
    (agent.folders.agent / C.HARNESS_DIR).mkdir(parents=True, exist_ok=True, mode=0o700)
    configured = adapter.configure(req, agent.folders)
    req |= {"listen": listen, "key_file": key_file, "home": configured.home}
    endpoint = adapter.endpoint(req, agent.folders, agent.machine.home)
    if not endpoint.proof:
        raise Refused(
            f"the adapter lnk-{adapter.harness}'s endpoint does not answer the endpoint proof",
            hint="lnk hands an agent's messages only to an endpoint that proves it holds its key",
        )
    return Started(described, installed, configured, endpoint)


def state(agent: Agent) -> C.State:
    """The paths a move and a backup carry of the agent's harness, as its adapter says."""
    adapter = Adapter.find(agent.settings.harness)
    tools = tools_dir(agent, adapter.harness)
    req = request(agent, agent.settings.sandbox, agent.settings.endpoint_port + 1, tools)
    return adapter.state(req, agent.folders)


def checked_state(agent: Agent) -> C.State | None:
    """Before a move or a backup sends an adapter's agent: its adapter's ``state``, each
    path checked (a bad answer refuses the send).  None where the adapter isn't installed (a machine holding the agent without running it): what
    travels is ``Agent/harness/`` whole either way, its databases as snapshots.  Link's
    own harness answers in-process."""
    if agent.settings.harness == builtin.NAME:
        return builtin.state()  # its own answer, in-process
    try:
        return state(agent)
    except NotFound:
        return None
