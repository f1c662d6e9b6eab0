"""What the connections' tests share: an agent with a real runner (and so a real bridge),
paired with a bot on the test Bot API server through the real ``lnk`` command line."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import threading
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
BOUND_S = 120.0  # what a test waits for at most (a bound: it ends as soon as it holds)
JOB_TEXT = "tick"  # the fault matrix's job: every 2 s, its answer to the owner's chat
JOB = f'cron = "* * * * * */2"\nmessage = "{JOB_TEXT}"\nthread = "telegram"\n'


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


class People:
    """The owner writing every ``every`` seconds (and, with ``stranger``, someone else too),
    from a thread, while a test moves the agent; what each message's update ID was."""

    def __init__(
        self, telegram: BotApiServer, tag: str, every: float = 0.1, stranger: int = 0
    ) -> None:
        self.telegram, self.tag, self.every, self.stranger = telegram, tag, every, stranger
        self.sent: dict[int, str] = {}  # update_id -> text
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self.every):
            text = f"{self.tag}-{i}"
            u = self.telegram.user_says(TOKEN, user_id=OWNER, text=text, first_name="Owner")
            self.sent[int(u["update_id"])] = text
            if self.stranger:
                self.telegram.user_says(TOKEN, user_id=self.stranger, text=f"stranger {text}")
            i += 1

    def __enter__(self) -> People:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __exit__(self, *exc: object) -> None:
        self.stop()


ANSWER = re.compile(r"you said: (.*) \(message \d+ in (\S+)\)$", re.S)


def answered_once(telegram: BotApiServer, texts: list[str], unknown: set[str]) -> dict[str, int]:
    """Every text's answer reached the owner exactly once, or (if its update is ``unknown``)
    at most once; nobody else was ever sent anything.  Counts by outcome."""
    got: dict[str, int] = {}
    whole: dict[str, int] = {}
    for e in telegram.sent(TOKEN):
        assert e["chat_id"] == OWNER, f"a message to chat {e['chat_id']}: {e['text'][:80]!r}"
        whole[e["text"]] = whole.get(e["text"], 0) + 1
        m = ANSWER.search(e["text"])
        if m and m[1] != JOB_TEXT:
            got[m[1]] = got.get(m[1], 0) + 1
    again = [t[:80] for t, n in whole.items() if n > 1]
    assert not again, f"sent more than once: {again[:5]}"
    twice = {t: n for t, n in got.items() if n > 1}
    assert not twice, f"answered more than once: {sorted(twice)[:10]}"
    missing = [t for t in texts if t not in got and t not in unknown]
    assert not missing, f"never answered: {missing[:10]}"
    return {
        "texts": len(texts),
        "answered": sum(1 for t in texts if t in got),
        "unknown": len(unknown),
    }


def ledger_rows(home: Path, agent: str, query: str) -> list[tuple[Any, ...]]:
    a = registry.find(Machine(home), agent)
    db = sqlite3.connect(a.folders.connections / "telegram" / "ledger.sqlite")
    try:
        return list(db.execute(query))
    finally:
        db.close()
