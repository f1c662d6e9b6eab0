"""A start of an agent whose harness is an adapter's (``lnk-<harness>``, docs/adapters.md).

The runner asks :func:`lnk.harnesses.setup.prepare` for everything (describe, needs,
install, configure, endpoint: each answer checked) and runs the endpoint's program
where it runs Link's own harness: sandboxed, listening on the sandbox's socket behind
the relay, with its proxy; or, unsandboxed, on the endpoint port.
"""

from __future__ import annotations

from lnk.agents import registry
from lnk.harnesses import builtin, setup
from lnk.runtime.startup import proxy_port
from lnk.sandbox import bwrap

BUILTIN = "builtin"


def is_adapted(agent: registry.Agent) -> bool:
    return agent.settings.harness != BUILTIN


def prepare(agent: registry.Agent, sandboxed: bool) -> setup.Started:
    if sandboxed:
        listen: dict[str, object] = {"unix": f"{bwrap.NET_DIR}/{bwrap.SOCKET_NAME}"}
        key_file = bwrap.KEY_PATH
    else:
        listen = {"port": agent.settings.endpoint_port}
        key_file = str(agent.runtime / "key")
    return setup.prepare(agent, sandboxed, proxy_port(agent), listen, key_file)


def describe_start(started: setup.Started) -> str:
    d, c = started.describe, started.configured
    return (
        f"harness {d.name} {d.harness} (adapter {d.adapter}, contract {d.contract}), "
        f"installed in {started.installed.root}, "
        + ("configured again" if c.changed else "configuration unchanged (.lnk/configured)")
    )


def describe_builtin() -> str:
    d = builtin.describe()
    return f"harness {d.name} {d.harness} (Link's own, in-process, contract {d.contract})"
