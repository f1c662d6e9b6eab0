"""Start an agent's runner as a real process and stop it after the test (a shared fixture)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.harness.client import read_key
from lnk.runtime.startup import wait_for_endpoint


class Running:
    def __init__(
        self, agent: registry.Agent, proc: subprocess.Popen[bytes], endpoint: dict[str, Any]
    ) -> None:
        self.agent = agent
        self.proc = proc
        self.endpoint = endpoint

    @property
    def port(self) -> int:
        return int(self.endpoint["port"])

    @property
    def key(self) -> bytes:
        return read_key(self.agent.runtime / "key")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def start_agent(home: Path) -> Iterator[Callable[..., Running]]:
    """start_agent(name, sandbox=False, store="files", env=None, model=None) -> Running."""
    started: list[Running] = []

    def start(
        name: str = "main",
        *,
        sandbox: bool = False,
        store: str = "files",
        env: dict[str, str] | None = None,
        model: Any = None,
        agent: registry.Agent | None = None,
    ) -> Running:
        machine = Machine.current()
        if agent is None:
            agent = registry.create(machine, name, store=store, model=model)
            agent.settings.sandbox = sandbox
            agent.save()
        log = agent.runtime / "harness.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lnk.runtime.runner", agent.id],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        try:
            endpoint = wait_for_endpoint(agent.runtime, timeout=60, proc=proc)
        except BaseException:
            proc.kill()
            proc.wait()
            print(log.read_text())
            raise
        r = Running(agent, proc, endpoint)
        started.append(r)
        return r

    yield start
    for r in started:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
            try:
                r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
