"""An answer whose caller went (a Ctrl-C'd chat, a turn a crash left) is not lost: the
next chat on its thread hands it over, once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lnkrun import ok
from servers import ModelServer
from test_endpoint import events

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.settings import ModelSettings
from lnk.errors import TransportError
from lnk.harness import client


@pytest.fixture
def slow_model() -> Iterator[ModelServer]:
    server = ModelServer("slow")
    server.gate = threading.Event()
    yield server
    server.gate.set()
    server.stop()


def _wait(what: str, cond: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout  # a bound on a wait, not a timing
    while not cond():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


@pytest.fixture
def started(slow_model: ModelServer) -> Iterator[registry.Agent]:
    """An unsandboxed agent thinking with the slow model, started by ``lnk agent start``."""
    agent = registry.create(
        Machine.current(),
        "main",
        model=ModelSettings("openai", slow_model.base_url, "m", "SLOW_KEY"),
    )
    agent.settings.sandbox = False
    agent.save()
    ok("agent", "start", env={"SLOW_KEY": "sk-slow-0123456789"})
    yield agent
    if slow_model.gate is not None:
        slow_model.gate.set()
    ok("agent", "stop")


def test_a_ctrl_c_d_chat_s_answer_comes_with_the_next_chat_once(
    started: registry.Agent, slow_model: ModelServer
) -> None:
    agent = started
    # Ctrl-C as a terminal's foreground process takes it, whatever this run inherited (a
    # shell's background job starts with SIGINT ignored, and a child keeps that)
    as_typed = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['lnk', 'agent', 'chat', 'send', 'first question']; "
        "runpy.run_module('lnk', run_name='__main__')"
    )
    chat = subprocess.Popen(
        [sys.executable, "-c", as_typed],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )
    _wait("the model asked", lambda: slow_model.requests or chat.poll() is not None)
    assert chat.poll() is None, chat.communicate()
    chat.send_signal(signal.SIGINT)  # the person gives up waiting
    assert chat.wait(60) != 0
    assert slow_model.gate is not None
    slow_model.gate.set()  # ... and the model answers after all
    _wait("the answer kept", lambda: any(e["type"] == "unclaimed" for e in events(agent)))

    nxt = ok("agent", "chat", "send", "--json", "second")
    doc = nxt.json()
    assert doc["answer"] == "slow heard second"
    assert [(e["text"], e["answer"]) for e in doc["earlier"]] == [
        ("first question", "slow heard first question")
    ]
    assert doc["earlier"][0]["message_id"]  # the message's ID, for a script to match
    again = ok("agent", "chat", "send", "--json", "third").json()
    assert again["earlier"] == []  # handed over once
    printed = ok("agent", "chat", "send", "fourth")
    assert "first question" not in printed.out + printed.err


def test_a_repeated_message_id_takes_its_kept_answer(
    start_agent: Any, slow_model: ModelServer
) -> None:
    """The caller that went comes back with the same message ID: it gets its answer, and
    the next chat does not get it again."""
    agent = registry.create(
        Machine.current(),
        "main",
        model=ModelSettings("openai", slow_model.base_url, "m", "SLOW_KEY"),
    )
    agent.settings.sandbox = False
    agent.save()
    r = start_agent(agent=agent, env={"SLOW_KEY": "sk-slow-0123456789"})
    with pytest.raises(TransportError, match="took longer than 1s"):
        client.send_message(r.port, r.key, "link:main", "q", timeout=1, message_id="m-1")
    assert slow_model.gate is not None
    slow_model.gate.set()
    _wait("the answer kept", lambda: any(e["type"] == "unclaimed" for e in events(agent)))
    answer = client.send_message(r.port, r.key, "link:main", "q", timeout=30, message_id="m-1")
    assert answer == "slow heard q"
    assert client.claim_unclaimed(r.port, r.key, "link:main") == []
    types = [e["type"] for e in events(agent)]
    assert types == ["message", "answer", "unclaimed", "claimed"], types
