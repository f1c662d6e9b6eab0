"""What one start of an agent is made of, apart from the process that runs it.

The agent's grants checked for what its sandbox can enforce, the harness's
config (``harness.json``: no secrets), the address of the agent's proxy inside
the sandbox, the files of ``<runtime>/`` written so only the user reads them,
and ``endpoint.json`` waited for by whoever started the runner
(``runner.py``, ``python -m lnk.runtime.runner ID``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lnk.agents import registry
from lnk.agents.grants import Spec, read_spec, unenforceable
from lnk.errors import AgentNotRunning, Refused
from lnk.runtime import model_route

READY_TIMEOUT_S = 30.0


def write_private(path: Path, data: bytes) -> None:
    """Write a file only the user can read, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_json(path: Path, obj: dict[str, Any]) -> None:
    write_private(path, json.dumps(obj, indent=1).encode() + b"\n")


def proxy_port(agent: registry.Agent) -> int:
    """The port the proxy's relay listens on inside the sandbox (the agent's second)."""
    return agent.settings.endpoint_port + 1


def check_grants(agent: registry.Agent) -> Spec:
    """The agent's grants, or Refused naming what its sandbox can't enforce."""
    if not agent.settings.sandbox:
        return Spec()  # unsandboxed: nothing of the file holds, as before
    path = agent.folders.sandbox_toml
    spec = read_spec(path)
    bad = unenforceable(spec)
    if bad:
        raise Refused(
            f"the agent {agent.name}'s {path} has {', '.join(bad)}, which this machine's "
            "sandbox can't enforce",
            hint=f"take it out of the file (lnk agent deny --agent {agent.name} ...), "
            "or edit the file by hand",
        )
    return spec


def proxy_env(port: int) -> dict[str, str]:
    url = f"http://127.0.0.1:{port}"
    env = {k: url for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")}
    env |= {k.lower(): v for k, v in env.items()}
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    return env


def harness_config(agent: registry.Agent, sandboxed: bool) -> dict[str, Any]:
    s = agent.settings
    model = asdict(s.model)
    if sandboxed and s.model.provider == "openai" and s.model.base_url:
        # the harness speaks plain HTTP to its proxy, which adds the key outside
        model["proxy_url"] = f"http://127.0.0.1:{proxy_port(agent)}{model_route.PREFIX}"
    return {
        "id": s.id,
        "name": s.name,
        "owner": s.owner,
        "sandboxed": sandboxed,
        "store": s.store,
        "chats": str(agent.folders.chats),
        "renew_s": s.renew_s,
        "lapse_s": s.lapse_s,
        "model": model,
    }


def wait_for_endpoint(
    runtime: Path, timeout: float = READY_TIMEOUT_S, proc: subprocess.Popen[bytes] | None = None
) -> dict[str, Any]:
    """Poll until the runner in ``runtime`` wrote endpoint.json (its harness listens).

    Raises AgentNotRunning if the runner gave up (exit.json, or ``proc`` exited)
    or the deadline passed.
    """
    endpoint, exit_file = runtime / "endpoint.json", runtime / "exit.json"
    deadline = time.monotonic() + timeout
    while True:
        try:
            data: dict[str, Any] = json.loads(endpoint.read_text())
            return data
        except (FileNotFoundError, ValueError):
            pass
        why = None
        # with the runner's process at hand, an exit.json from an earlier start can't mislead
        ended = proc.poll() is not None if proc is not None else exit_file.exists()
        if ended:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                why = json.loads(exit_file.read_text()).get("reason")
            why = why or "the runner stopped"
        elif time.monotonic() > deadline:
            why = f"it did not answer within {timeout:g}s"
        if why:
            raise AgentNotRunning(
                f"the agent did not start: {why}", hint=f"read {runtime / 'harness.log'}"
            )
        time.sleep(0.02)
