"""What the connections' tests share: an agent with a real runner (and so a real bridge),
paired with a bot on the test Bot API server through the real ``lnk`` command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from telegram_api import BotApiServer

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.stores import open_agent_store
from lnk.collections.base import CollectionId

TOKEN = "4242:AAHfiqksKZ8WmR2zSjiQ7_v4TMAKdiHm9T0"
OWNER = 42
BOUND_S = 60.0  # what a test waits for at most (a bound: it ends as soon as it holds)


def wait_for(what: str, pred: Callable[[], Any], bound: float = BOUND_S) -> Any:
    """``pred()`` once it is truthy; fails naming ``what`` if it never is within ``bound``."""
    deadline = time.monotonic() + bound
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def lnk_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from lnk.cli.main import main; main()", *args]


def connect(
    home: Path,
    telegram: BotApiServer,
    agent: str = "main",
    owner: int = OWNER,
    before: Callable[[str], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``lnk agent connect telegram`` run for real; the owner sends the code it prints
    (``before(code)`` runs first: strangers' messages, say)."""
    env = {**os.environ, "HOME": str(home), "TOK": TOKEN}
    args = ["agent", "connect", "telegram", "--agent", agent, "--token-from-env", "TOK"]
    proc = subprocess.Popen(
        lnk_cmd(*args, "--api", telegram.base_url),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    code = proc.stdout.readline().strip()
    assert len(code) == 9 and code[4] == "-", code
    if before is not None:
        before(code)
    telegram.user_says(TOKEN, user_id=owner, text=f"/start {code}", first_name="Owner")
    out, err = proc.communicate(timeout=BOUND_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, code + "\n" + out, err)


def sent_texts(telegram: BotApiServer, chat: int = OWNER) -> list[str]:
    return [e["text"] for e in telegram.sent(TOKEN, chat) if e["method"] == "sendMessage"]


def events(home: Path, agent: str, thread: str) -> list[dict[str, Any]]:
    a = registry.find(Machine(home), agent)
    store = open_agent_store(a.folders.chats, a.settings.store, 60)
    return [
        dict(ev.data, number=ev.number) for ev in store.iter_events(CollectionId("events", thread))
    ]


def bridge_log(home: Path, agent: str = "main") -> str:
    a = registry.find(Machine(home), agent)
    p = a.runtime / "harness.log"
    return p.read_text(errors="replace") if p.exists() else ""
