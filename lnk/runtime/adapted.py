"""A start of an agent whose harness is an adapter's (``lnk-<harness>``, docs/adapters.md).

The runner asks :func:`lnk.harnesses.setup.prepare` for everything (describe, needs,
install, configure, endpoint: each answer checked) and runs the endpoint's program
where it runs Link's own harness: sandboxed, listening on the sandbox's socket behind
the relay, with its proxy; or, unsandboxed, on the endpoint port.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import tomli_w

from lnk.agents import registry
from lnk.harnesses import builtin, setup
from lnk.harnesses.contract import Hosts
from lnk.runtime.proxy import AgentProxy
from lnk.runtime.startup import proxy_env, proxy_port
from lnk.sandbox import bwrap
from lnk.sandbox.relay import TcpToUnixRelay

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
    return setup.prepare(agent, sandboxed, proxy_port(agent), listen, key_file, install_proxy)


@contextlib.contextmanager
def install_proxy(hosts: Hosts) -> Iterator[dict[str, str]]:
    """The install's way out: a proxy like the agent's whose grants are the hosts the
    adapter lists (internet-hosts) and nothing else, on a loopback port of its own, named
    in the install's HTTP(S)_PROXY with no exception.  The install runs outside the
    sandbox: a program that ignores the variables isn't held by it (docs/adapters.md)."""
    tmp = Path(tempfile.mkdtemp(prefix="lnk-install-"))
    proxy: AgentProxy | None = None
    relay: TcpToUnixRelay | None = None
    try:
        grants = tmp / "sandbox.toml"
        # a name the adapter lists is reached wherever it resolves (a mirror on your
        # network too), except this machine; nothing else is
        names = list(hosts.hosts)
        grants.write_text(tomli_w.dumps({"internet": {"hosts": names}, "lan": {"hosts": names}}))
        proxy = AgentProxy(tmp / "proxy.sock", grants)
        proxy.start()
        relay = TcpToUnixRelay(0, tmp / "proxy.sock")
        relay.start()
        env = proxy_env(relay.port)
        yield env | {"NO_PROXY": "", "no_proxy": ""}
    finally:
        if relay is not None:
            relay.stop()
        if proxy is not None:
            proxy.stop()
        shutil.rmtree(tmp, ignore_errors=True)


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
