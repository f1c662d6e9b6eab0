"""``python -m lnk.connections.bridge AGENT_ID RUNNER_PID``: one agent's bridge.

Started by the agent's runner once its harness answers, outside the sandbox, and
stopped with it (SIGTERM first; it also dies with the runner: PR_SET_PDEATHSIG, and
its fence checks its parent).  It runs, each in a thread:

* the Telegram worker (:mod:`lnk.connections.telegram`), while the agent's settings
  hold ``[bots.telegram]`` and its secrets ``TELEGRAM_BOT_TOKEN`` (started, stopped
  and started again as they change: ``lnk agent connect`` / ``disconnect``);
* the scheduler (:mod:`lnk.connections.scheduler`) of ``Agent/schedule/*.toml``;

and, in the main thread, the fence (:mod:`lnk.connections.fence`), four times a
second, and ``<runtime>/bridge.json``: what ``lnk agent status`` says of it.  Its
lines go to the agent's log as ``lnk bridge: ...``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk import logs
from lnk.agents import registry, secrets
from lnk.agents.bots import TELEGRAM, TELEGRAM_TOKEN, check_bots
from lnk.agents.layout import Machine
from lnk.agents.settings import read_raw
from lnk.connections.fence import Fence, Gate, Stopped, read_key
from lnk.connections.ledger import Ledger, LedgerInvalid
from lnk.connections.scheduler import Scheduler
from lnk.connections.telegram import TelegramWorker
from lnk.connections.telegram_api import BotApi
from lnk.errors import LnkError
from lnk.harness.client import send_message
from lnk.signals import on_signals

TURN_S = 300.0
CHECK_S = 0.25
DRAIN_S = 25.0  # a sendMessage under way ends (its own timeout is 20 s)
PR_SET_PDEATHSIG = 1


def telegram_dir(agent: registry.Agent) -> Path:
    return agent.folders.connections / "telegram"


def schedule_ledger(agent: registry.Agent) -> Path:
    return agent.folders.connections / "schedule" / "ledger.sqlite"


def die_with_parent() -> None:
    """Be sent SIGTERM when the thread that started this process ends (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Worker:
    """A worker's thread, and what it was started with."""

    def __init__(
        self, name: str, gate: Gate, target: Callable[[], None], log: logging.Logger
    ) -> None:
        self.gate, self.log, self.name = gate, log, name
        self.thread = threading.Thread(target=self._run, args=(target,), name=name, daemon=True)
        self.crashed = False
        self.thread.start()

    def _run(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Stopped:
            pass
        except Exception as e:  # a bug: logged, the worker started again by the supervisor
            self.crashed = True
            self.log.exception("%s stopped on an error: %s", self.name, type(e).__name__)


class Bridge:
    def __init__(self, agent: registry.Agent, gate: Gate, key: bytes, log: logging.Logger) -> None:
        self.agent, self.gate, self.key, self.log = agent, gate, key, log
        self.port = agent.settings.endpoint_port
        self.telegram: TelegramWorker | None = None
        self.telegram_run: Worker | None = None
        self.telegram_conf: tuple[Any, ...] | None = None
        self.scheduler: Scheduler | None = None
        self.scheduler_run: Worker | None = None
        self._status: dict[str, Any] = {}
        self._restarts = 0

    def deliver(self, thread: str, text: str, message_id: str) -> str:
        """One message to the agent's endpoint, as ``lnk agent chat send`` sends it."""
        return send_message(
            self.port, self.key, thread, text, timeout=TURN_S, message_id=message_id
        )

    # -- the connections as the settings say now ------------------------------------------

    def _telegram_wanted(self) -> tuple[Any, ...] | None:
        try:
            data = read_raw(self.agent.settings_path)
            bots = check_bots(data.get("bots"), str(self.agent.settings_path))
            token = secrets.get(self.agent.machine, self.agent.id, TELEGRAM_TOKEN)
        except (LnkError, OSError):
            return self.telegram_conf  # a settings file mid-edit: as it was
        section = bots.get(TELEGRAM)
        if section is None or not token:
            return None
        return (section["api"], int(section["owner"]), token)

    def owner_chat(self) -> int | None:
        conf = self.telegram_conf
        return int(conf[1]) if conf is not None else None

    def telegram_out(self, out_id: str, chat: int, answer: str) -> None:
        try:
            ledger = Ledger(telegram_dir(self.agent) / "ledger.sqlite")
        except LedgerInvalid as e:  # its answer stays in the conversation alone
            self.log.error("telegram: %s's answer is not sent: %s", out_id, e.message)
            return
        try:
            ledger.add_out(out_id, chat, answer)
        finally:
            ledger.close()
        if self.telegram is not None:
            self.telegram.api.abort()  # ends its long poll: it sends at once

    def sync(self) -> None:
        wanted = self._telegram_wanted()
        run = self.telegram_run
        dead = run is not None and not run.thread.is_alive() and run.crashed
        if wanted != self.telegram_conf or dead:
            if run is not None:
                run.gate.end("its connection changed")
                if self.telegram is not None:
                    self.telegram.api.abort()
                run.thread.join(DRAIN_S)
            self.telegram = self.telegram_run = None
            self.telegram_conf = wanted
            if wanted is not None:
                if dead:
                    self._restarts += 1
                    self.gate.wait(min(30.0, float(self._restarts)))
                api, owner, token = wanted
                gate = self.gate.child()
                self.telegram = TelegramWorker(
                    gate,
                    BotApi(api, token),
                    telegram_dir(self.agent) / "ledger.sqlite",
                    owner,
                    self.deliver,
                    self.log,
                )
                self.telegram_run = Worker("telegram", gate, self.telegram.run, self.log)
                self.log.info("telegram: answering its owner, user %d", owner)
        if self.scheduler_run is None or (
            self.scheduler_run.crashed and not self.scheduler_run.thread.is_alive()
        ):
            if self.scheduler_run is not None:
                self._restarts += 1
                self.gate.wait(min(30.0, float(self._restarts)))
            gate = self.gate.child()
            self.scheduler = Scheduler(
                gate,
                self.agent.folders.collection_dir("schedule"),
                schedule_ledger(self.agent),
                self.deliver,
                self.log,
                owner_chat=self.owner_chat,
                telegram_out=self.telegram_out,
            )
            self.scheduler_run = Worker("schedule", gate, self.scheduler.run, self.log)

    def write_status(self) -> None:
        st: dict[str, Any] = {"pid": os.getpid(), "epoch": self.gate.fence.epoch}
        st["held"] = self.gate.fence.held()
        if self.telegram is not None:
            st["telegram"] = {"state": self.telegram.state, "note": self.telegram.note}
        if self.scheduler is not None:
            st["schedule"] = {"state": self.scheduler.state, "jobs": len(self.scheduler.jobs)}
        if st != self._status:
            self._status = st
            path = self.agent.runtime / "bridge.json"
            with contextlib.suppress(OSError):
                tmp = path.with_name(".bridge.json.tmp")
                tmp.write_text(json.dumps(st) + "\n")
                os.replace(tmp, path)

    def run(self) -> int:
        self.log.info(
            "started for %s (%s), epoch %d", self.agent.name, self.agent.id, self.gate.fence.epoch
        )
        try:
            while not self.gate.stop.is_set():
                why = self.gate.fence.why_not()
                if why is not None:
                    self.gate.end(why)
                    break
                self.sync()
                self.write_status()
                self.gate.stop.wait(CHECK_S)
        except Stopped:
            pass
        self.gate.end(self.gate.reason or "stopping")
        if self.telegram is not None:
            self.telegram.api.abort()
        if not self.gate.drain(DRAIN_S):
            self.log.warning("an act under way did not end within %.0f s", DRAIN_S)
        self.log.info("stopped: %s", self.gate.reason)
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m lnk.connections.bridge AGENT_ID RUNNER_PID", file=sys.stderr)
        return 2
    parent = int(args[1])
    die_with_parent()
    if os.getppid() != parent:
        return 0  # the runner was gone before this process could hear of it
    logs.setup()
    log = logs.get("bridge")
    machine = Machine.current()
    try:
        agent = registry.find_by_id(machine, args[0])
    except LnkError as e:
        log.error("error: %s", e.message)
        return e.exit_code
    if agent is None:
        log.error("error: no agent with id %s here", args[0])
        return 1
    key = read_key(agent.runtime / "key")
    fence = Fence(machine, agent.id, agent.name, agent.settings.epoch, key, parent)
    gate = Gate(fence)
    bridge = Bridge(agent, gate, key, log)

    def on_signal(signum: int) -> None:
        gate.end(f"signal {signum}")
        if bridge.telegram is not None:
            bridge.telegram.api.abort()

    # off the main thread: it waits on the gate's Event four times a second, and a Python
    # handler setting that Event there could wait for ever for a lock the thread holds
    on_signals(on_signal)
    pidfile = agent.runtime / "bridge.pid"
    # whole or not at all: a reader (the runner's cleanup, a status) never finds it empty
    part = pidfile.with_name(f".bridge.pid.{os.getpid()}")
    part.write_text(f"{os.getpid()}\n")
    os.replace(part, pidfile)
    try:
        code = bridge.run()
    finally:
        with contextlib.suppress(OSError):
            if pidfile.read_text().strip() == str(os.getpid()):
                pidfile.unlink()
        logging.shutdown()
    os._exit(code)  # the workers are daemon threads, maybe mid-call to the harness: abandoned


if __name__ == "__main__":
    sys.exit(main())
