"""``python -m lnk.runtime.runner AGENT_ID``: one agent's harness, in the foreground.

Started in the background by the service layer (stdout/stderr to
``<runtime>/harness.log``).  It:

1. loads the agent, makes a fresh 32-byte endpoint key for this start and
   writes ``<runtime>/key`` (0600, folder 0700) and ``<runtime>/harness.json``
   (what the harness knows of its agent: no secrets);
2. starts the harness: sandboxed, under bubblewrap, serving on a unix socket
   in ``~/.lnk/agents/.net/<id>/`` with a relay from host
   ``127.0.0.1:<endpoint port>``; or, with the sandbox off, directly on that port;
3. once the harness listens, writes ``<runtime>/endpoint.json`` and starts the
   agent's bridge (its connections and schedules: ``bridge_proc.py``);
4. if the harness dies, writes ``<runtime>/exit.json`` and exits non-zero;
   on SIGTERM/SIGINT stops the bridge first, then the harness and the relay,
   removes ``key`` and ``endpoint.json`` and exits 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from lnk.agents import registry, secrets
from lnk.agents.grants import Spec
from lnk.agents.layout import Machine
from lnk.agents.machine import load_machine
from lnk.bridges.proof import new_key
from lnk.errors import LnkError, NotFound, PortsUnavailable
from lnk.harnesses.setup import Started
from lnk.runtime import adapted
from lnk.runtime.bridge_proc import BridgeProcess
from lnk.runtime.proxy import AgentProxy
from lnk.runtime.startup import (
    READY_TIMEOUT_S,
    check_grants,
    harness_config,
    proxy_env,
    proxy_port,
    write_json,
    write_private,
)
from lnk.sandbox import bwrap, limits
from lnk.sandbox.relay import TcpToUnixRelay
from lnk.sandbox.unixsock import connect_unix
from lnk.signals import on_signals

STOP_TIMEOUT_S = 70.0  # the harness lets a running turn end (up to 60 s)


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def log(msg: str) -> None:
    print(f"{iso_now()} lnk runner: {msg}", flush=True)


def _connects_tcp(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _connects_unix(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        connect_unix(s, path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, parents before children (from /proc)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop(0))
        out += kids
        todo += kids
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _is_inrelay(pid: int) -> bool:
    try:
        return b"lnk.sandbox.inrelay" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class Runner:
    def __init__(self, agent: registry.Agent) -> None:
        self.agent = agent
        self.sandboxed = agent.settings.sandbox
        self.proc: subprocess.Popen[bytes] | None = None
        self.relay: TcpToUnixRelay | None = None
        self.proxy: AgentProxy | None = None
        self.spec = Spec()
        self.cgroup: limits.Cgroup | None = None
        self.stopping = threading.Event()
        self.bridge = BridgeProcess(agent.id, agent.machine.home, log)
        self.adapted: Started | None = None  # an adapter's harness's start

    @property
    def runtime(self) -> Path:
        return self.agent.runtime

    def command(self) -> bwrap.Sandboxed:
        port = self.agent.settings.endpoint_port
        if self.adapted is not None and not self.sandboxed:
            return bwrap.Sandboxed(list(self.adapted.endpoint.argv))
        if not self.sandboxed:
            return bwrap.Sandboxed(
                [
                    sys.executable,
                    "-m",
                    "lnk.harness",
                    "serve",
                    "--config",
                    str(self.runtime / "harness.json"),
                    "--key-file",
                    str(self.runtime / "key"),
                    "--port",
                    str(port),
                ]
            )
        python = bwrap.sandbox_python()
        inner: list[str] = [
            python,
            "-m",
            "lnk.harness",
            "serve",
            "--config",
            bwrap.CONFIG_PATH,
            "--key-file",
            bwrap.KEY_PATH,
            "--unix",
            f"{bwrap.NET_DIR}/{bwrap.SOCKET_NAME}",
        ]
        env = {} if self.spec.mode == "host" else proxy_env(proxy_port(self.agent))
        binds: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        if self.adapted is not None:
            e = self.adapted.endpoint
            inner, binds = list(e.argv), (e.read, e.write)
            env |= dict(e.env)
        # first in the sandbox: the relay to the agent's proxy, then the harness
        relay = [
            python,
            "-S",  # no site: the relay needs the standard library and lnk (PYTHONPATH) alone
            "-m",
            "lnk.sandbox.inrelay",
            str(proxy_port(self.agent)),
            f"{bwrap.NET_DIR}/{bwrap.PROXY_SOCKET}",
            "--",
        ]
        caps = limits.Limits.of(self.spec)
        self.cgroup = limits.make_cgroup(self.agent.id, caps)
        # the model's key stays outside: the proxy adds it (never key_env in here)
        return bwrap.sandboxed(
            self.agent,
            relay + inner,
            bwrap=bwrap.check_bwrap(),
            env=env,
            network_mode=self.spec.mode,
            files=(self.spec.read, self.spec.write),
            prefix=limits.launch_prefix(caps, self.cgroup),
            harness=binds,
        )

    def model_key(self) -> str | None:
        """The model's key, read outside the sandbox at each call: a secret, or the variable."""
        name = self.agent.settings.model.key_env
        return secrets.get(self.agent.machine, self.agent.id, name) or os.environ.get(name)

    def start_proxy(self) -> None:
        m = self.agent.settings.model
        self.proxy = AgentProxy(
            self.agent.net / bwrap.PROXY_SOCKET,
            self.agent.folders.sandbox_toml,
            runtime=self.runtime,
            model_url=m.base_url if m.provider == "openai" else "",
            model_key=self.model_key,
        )
        self.proxy.start()

    def prepare(self) -> None:
        s = self.agent.settings
        if not self.sandboxed:
            load_machine(self.agent.machine).check_unsandboxed(s.name)
        if not 0 < s.endpoint_port < 65536:
            raise PortsUnavailable(
                f"the agent {s.name} has no endpoint port in its settings",
                hint="start it with lnk agent start, which gives it a block of ports",
            )
        self.spec = check_grants(self.agent)
        self.runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.runtime, 0o700)
        (self.runtime / "exit.json").unlink(missing_ok=True)
        (self.runtime / "proxy-refused.json").unlink(missing_ok=True)
        (self.runtime / "endpoint.json").unlink(missing_ok=True)
        write_private(self.runtime / "key", new_key())
        write_json(self.runtime / "harness.json", harness_config(self.agent, self.sandboxed))
        if adapted.is_adapted(self.agent):
            self.adapted = adapted.prepare(self.agent, self.sandboxed)
            log(adapted.describe_start(self.adapted))
        else:
            log(adapted.describe_builtin())
        if self.sandboxed:
            self.agent.net.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.agent.net, 0o700)
            (self.agent.net / bwrap.SOCKET_NAME).unlink(missing_ok=True)
            self.start_proxy()

    def wait_ready(self) -> bool:
        assert self.proc is not None
        sock = self.agent.net / bwrap.SOCKET_NAME
        port = self.agent.settings.endpoint_port
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and not self.stopping.is_set():
            if self.proc.poll() is not None:
                return False
            if self.sandboxed and sock.exists() and _connects_unix(sock):
                return True
            if not self.sandboxed and _connects_tcp(port):
                return True
            time.sleep(0.02)
        return False

    def start(self) -> None:
        self.prepare()
        cmd = self.command()
        log(
            f"starting agent {self.agent.name} ({self.agent.id}), "
            f"{'sandboxed' if self.sandboxed else 'WITHOUT a sandbox'}: {' '.join(cmd.argv)}"
        )
        # sandboxed, bubblewrap starts with a bare environment (LAUNCH_ENV); unsandboxed, the
        # harness gets this one (it reads the model's key variable itself, as ever)
        env = None if self.sandboxed else dict(os.environ)
        if env is not None and self.adapted is not None:
            env |= dict(self.adapted.endpoint.env)
        self.proc = cmd.popen(stdin=subprocess.DEVNULL, **({} if env is None else {"env": env}))
        if not self.wait_ready():
            if self.stopping.is_set():
                return
            code = self.proc.poll()
            raise LnkError(
                f"the harness did not start listening (exit {code})",
                hint=f"read {self.runtime / 'harness.log'}",
            )
        port = self.agent.settings.endpoint_port
        if self.sandboxed:
            self.relay = TcpToUnixRelay(port, self.agent.net / bwrap.SOCKET_NAME)
            self.relay.start()
        write_json(
            self.runtime / "endpoint.json",
            {
                "port": port,
                "pid": os.getpid(),
                "harness_pid": self.proc.pid,
                "sandboxed": self.sandboxed,
                "started": iso_now(),
            },
        )
        log(f"agent {self.agent.name} answers on 127.0.0.1:{port}")
        self.bridge.start()

    def stop_harness(self) -> None:
        self.bridge.stop()  # first: its polling and firing end before the harness's last turn
        proc = self.proc
        if proc is None or proc.poll() is not None:
            if self.relay is not None:
                self.relay.stop()
            if self.proxy is not None:
                self.proxy.stop()
            return
        try:
            self._stop_proc(proc)
        finally:
            # the relay and proxy go last, so a turn ending during the stop still answers
            if self.relay is not None:
                self.relay.stop()
            if self.proxy is not None:
                self.proxy.stop()

    def _stop_proc(self, proc: subprocess.Popen[bytes]) -> None:
        # bwrap doesn't pass signals on: ask the harness inside to stop itself first
        inner = descendants(proc.pid) if self.sandboxed else []
        # the harness: the proxy's relay's child in the sandbox (the relay ends with it),
        # never a process of the harness's own (an adapter's endpoint runs its harness's
        # turns as its children: it lets them end); else the leaves, not bwrap's init
        harness = [k for p in inner if _is_inrelay(p) for k in _children(p)]
        leaves = harness or [p for p in inner if not descendants(p)]
        for pid in leaves:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        if not inner:
            proc.terminate()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
                return
            except subprocess.TimeoutExpired:
                log(f"the harness did not stop; sending signal {sig}")
                proc.send_signal(sig)
        proc.wait()

    def cleanup(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
        for name in ("key", "endpoint.json"):
            (self.runtime / name).unlink(missing_ok=True)
        (self.agent.net / bwrap.SOCKET_NAME).unlink(missing_ok=True)
        (self.agent.net / bwrap.PROXY_SOCKET).unlink(missing_ok=True)

    def write_exit(self, code: int, reason: str) -> None:
        write_json(self.runtime / "exit.json", {"code": code, "at": iso_now(), "reason": reason})

    def run(self) -> int:
        """Start, then wait until a signal (returns 0) or the harness's death (non-zero)."""
        try:
            self.start()
        except LnkError as e:
            log(f"error: {e.message}" + (f" (hint: {e.hint})" if e.hint else ""))
            self.stop_harness()
            self.cleanup()
            self.write_exit(e.exit_code, e.message)
            return e.exit_code
        assert self.proc is not None
        # woken at once by a stop (the signals' thread sets it), else every 0.1 s to see
        # whether the harness and the bridge still run (not Popen.wait's own polling,
        # which slept on past a stop)
        while not self.stopping.wait(timeout=0.1):
            code = self.proc.poll()
            if code is None:
                self.bridge.check()
                continue
            if self.stopping.is_set():
                break
            log(f"the harness exited with code {code}")
            self.stop_harness()
            self.cleanup()
            self.write_exit(code, f"the harness exited with code {code}")
            return code if code > 0 else 1
        log("stopping")
        self.stop_harness()
        self.cleanup()
        log("stopped")
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lnk.runtime.runner AGENT_ID", file=sys.stderr)
        return 2
    machine = Machine.current()
    try:
        agent = registry.find_by_id(machine, args[0])
        if agent is None:
            raise NotFound(f"no agent with id {args[0]} on this machine")
    except LnkError as e:
        log(f"error: {e.message}")
        return e.exit_code
    runner = Runner(agent)

    def on_signal(signum: int) -> None:
        log(f"signal {signum}")
        runner.stopping.set()

    # not in a Python handler: one that printed while the main thread was printing a line
    # raised "reentrant call" there, in the middle of whatever it was doing (lnk.signals)
    on_signals(on_signal)
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
