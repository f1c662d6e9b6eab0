"""Running an agent in the background, keyed by its ID.

A systemd user unit (``lnk-agent-<id>.service``) where a user systemd runs,
otherwise a supervised background process with a pidfile.  Either way the
process is the runner (``python -m lnk.runtime.runner ID``), which makes the
start's key, starts the harness (in its sandbox unless the agent's setting says
otherwise) and writes ``endpoint.json`` once the harness listens.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lnk.agents import ports
from lnk.agents.backup_key import key_warning
from lnk.agents.grants import read_spec
from lnk.agents.machine import account_owner, load_machine
from lnk.agents.models import describe as describe_model
from lnk.agents.models import key_place
from lnk.agents.registry import Agent, last_backup, taken_blocks
from lnk.agents.running import is_running, pid_alive, read_json, runner_pid
from lnk.errors import AgentNotRunning
from lnk.harness.client import status as harness_status
from lnk.logs import tail_lines
from lnk.protocol import Status
from lnk.runtime.bridge_proc import kill_stray
from lnk.runtime.proxy_log import last_refusal
from lnk.runtime.startup import check_grants
from lnk.sandbox.bwrap import check_bwrap
from lnk.sandbox.limits import Limits, systemd_properties
from lnk.text import one_line

START_DEADLINE_S = float(os.environ.get("LNK_START_DEADLINE", "30"))


def _manager() -> str:
    forced = os.environ.get("LNK_SERVICE_MANAGER")
    if forced in ("systemd", "process"):
        return forced
    if shutil.which("systemctl") is None:
        return "process"
    try:
        r = subprocess.run(
            ["systemctl", "--user", "is-system-running"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return "process"
    return "systemd" if r.stdout.strip() in ("running", "degraded", "starting") else "process"


def prepare_start(agent: Agent, sandbox: bool | None) -> list[str]:
    """Settle the agent's settings before a start; returns notes for the person."""
    notes: list[str] = []
    machine_settings = load_machine(agent.machine)
    s = agent.settings
    if not (s.sandbox if sandbox is None else sandbox):
        machine_settings.check_unsandboxed(s.name)  # before the switch is kept
    if sandbox is not None and sandbox != s.sandbox:
        s.sandbox = sandbox
        agent.save()
    acct = account_owner(agent.machine)
    if acct and s.owner.startswith("local-"):
        notes.append(f"{s.name} now belongs to the signed-in account ({acct})")
        s.owner = acct
        agent.save()
    if s.sandbox:
        check_bwrap()
        check_grants(agent)  # a section its sandbox can't enforce refuses the start
    if not is_running(agent) and not ports.block_free(s.port_base, s.port_count):
        # (a running agent holds its own block: that is no reason to move it)
        old = s.port_base
        s.port_base = ports.random_free_block(
            taken_blocks(agent.machine, except_name=s.name), s.port_count
        )
        agent.save()
        notes.append(
            f"a program holds a port of {s.name}'s block {old}-{old + s.port_count - 1}; "
            f"it moves to {s.port_base}-{s.port_base + s.port_count - 1}"
        )
    return notes


def start(agent: Agent) -> Status:
    """Start the runner in the background and wait until the harness answers."""
    if is_running(agent):
        return status(agent)
    rt = agent.runtime
    rt.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in ("exit.json", "endpoint.json", "key"):
        (rt / stale).unlink(missing_ok=True)
    log = rt / "harness.log"
    env = dict(os.environ)
    env["HOME"] = str(agent.machine.home)
    argv = [sys.executable, "-m", "lnk.runtime.runner", agent.id]
    if _manager() == "systemd":
        _start_systemd(agent, argv, log)
    else:
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                cwd=str(agent.machine.home),
            )
        (rt / "runner.pid").write_text(f"{proc.pid}\n")
    return _wait_answering(agent)


def _unit_path(agent: Agent) -> Path:
    return (
        agent.machine.home
        / ".config"
        / "systemd"
        / "user"
        / f"{agent.settings.service_name}.service"
    )


def _start_systemd(agent: Agent, argv: list[str], log: Path) -> None:
    unit = _unit_path(agent)
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(
        "[Unit]\n"
        f"Description=lnk agent {agent.name} ({agent.id})\n\n"
        "[Service]\n"
        f"Environment=HOME={agent.machine.home}\n"
        f"ExecStart={' '.join(argv)}\n"
        f"ExecStartPost=/bin/sh -c 'echo $MAINPID > {agent.runtime}/runner.pid'\n"
        f"StandardOutput=append:{log}\nStandardError=append:{log}\n"
        "Restart=no\n" + "".join(f"{line}\n" for line in _unit_limits(agent))
    )
    subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)
    subprocess.run(["systemctl", "--user", "start", unit.name], check=True)


def _unit_limits(agent: Agent) -> list[str]:
    """A sandboxed agent's memory and process caps, as the unit's lines."""
    if not agent.settings.sandbox:
        return []
    return systemd_properties(Limits.of(read_spec(agent.folders.sandbox_toml)))


def _why_not_started(agent: Agent) -> str:
    """One line: the runner's reason (exit.json), else the log's last error line."""
    died = read_json(agent.runtime / "exit.json") or {}
    if isinstance(died.get("reason"), str) and died["reason"]:
        return one_line(died["reason"], 300)
    with contextlib.suppress(OSError):
        for line in reversed(tail_lines(agent.runtime / "harness.log", 40)):
            if "error" in line.lower():
                return one_line(line.split(": ", 1)[-1], 300)
    return "it left no reason"


def _wait_answering(agent: Agent) -> Status:
    began = time.monotonic()
    deadline = began + START_DEADLINE_S
    while time.monotonic() < deadline:
        st = status(agent)
        if st.running:
            return st
        if runner_pid(agent) is None and (agent.runtime / "runner.pid").exists():
            raise AgentNotRunning(
                f"{agent.name}'s harness stopped as it started: {_why_not_started(agent)}",
                hint=f"see lnk agent logs --agent {agent.name}",
            )
        # (a move's pause ends with this: asked every 10 ms while a start usually takes,
        # each ask a file read and at most a refused connection)
        time.sleep(0.01 if time.monotonic() - began < 2.0 else 0.05)
    stop(agent)
    raise AgentNotRunning(
        f"{agent.name}'s harness did not answer within {START_DEADLINE_S:.0f} s, so it was stopped",
        hint=f"see lnk agent logs --agent {agent.name}",
    )


def stop(agent: Agent, timeout: float = 150.0) -> bool:
    """Stop the agent's runner; True if something was running."""
    if _manager() == "systemd" and _unit_path(agent).exists():
        subprocess.run(["systemctl", "--user", "stop", _unit_path(agent).name], check=False)
    pid = runner_pid(agent)
    if pid is None:
        (agent.runtime / "runner.pid").unlink(missing_ok=True)
        kill_stray(agent.runtime, agent.id)  # its runner died (kill -9): the bridge goes too
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    pause = 0.005  # (a move's pause waits on this: looked at often at first)
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    if pid_alive(pid):
        os.killpg(pid, signal.SIGKILL) if _is_group_leader(pid) else os.kill(pid, signal.SIGKILL)
    kill_stray(agent.runtime, agent.id)  # stopped by its runner; one left behind goes now
    (agent.runtime / "runner.pid").unlink(missing_ok=True)
    (agent.runtime / "endpoint.json").unlink(missing_ok=True)
    (agent.runtime / "key").unlink(missing_ok=True)
    return True


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def endpoint_key(agent: Agent) -> bytes | None:
    try:
        return (agent.runtime / "key").read_bytes()
    except OSError:
        return None


def status(agent: Agent, ask: bool = True) -> Status:
    """The agent's status here; with ``ask``, its harness is asked whether it answers as
    this agent, otherwise the runner's word (``endpoint.json``) is taken."""
    s = agent.settings
    ep = read_json(agent.runtime / "endpoint.json")
    pid = runner_pid(agent)
    running, state, sandboxed = False, "stopped", s.sandbox
    problem: str | None = None
    died: dict[str, Any] | None = None
    if pid is not None:
        state = "starting"
        key = endpoint_key(agent)
        if ep and not ask:
            running, state = True, "running"
            sandboxed = bool(ep.get("sandboxed", s.sandbox))
        elif ep and key:
            try:
                answer = harness_status(int(ep["port"]), key, timeout=3.0)
            except Exception as e:
                state, problem = "not answering", str(e)
            else:
                running = answer.get("id") == s.id
                state = "running" if running else "answered as another agent"
                sandboxed = bool(ep.get("sandboxed", s.sandbox))
    else:
        died = read_json(agent.runtime / "exit.json")
        if died:
            state = "died"
    backup = last_backup(agent.runtime)
    if backup and not backup.get("ok") and problem is None:
        problem = f"the last backup failed at {backup.get('time')}: {backup.get('error')}"
    return Status(
        name=s.name,
        id=s.id,
        owner=s.owner,
        running=running,
        state=state,
        endpoint=f"http://127.0.0.1:{s.endpoint_port}",
        sandboxed=sandboxed,
        ports=tuple(s.ports),
        store=s.store,
        harness=s.harness,
        service=s.service_name,
        pid=pid,
        problem=problem,
        warning=key_warning(agent.machine),
        exit=died,
        refused=last_refusal(agent.runtime),
        backup=backup,
        model=describe_model(s.model, key_place(agent.machine, s.id, s.model)),
        connections=_connections(agent) if pid is not None else None,
    )


def _connections(agent: Agent) -> dict[str, Any] | None:
    """What the agent's bridge says of its connections (bridge.json), known keys alone."""
    doc = read_json(agent.runtime / "bridge.json") or {}
    out: dict[str, Any] = {}
    if agent.machine.hold_file(agent.id).exists():
        out["held"] = "by a move until the copy where it was is gone"
    for name in ("telegram", "schedule"):
        part = doc.get(name)
        if isinstance(part, dict):
            out[name] = {k: str(v)[:300] for k, v in part.items() if k in ("state", "note", "jobs")}
    return out or None
