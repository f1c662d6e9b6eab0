"""The Telegram connection end to end: a real runner starts the agent's bridge, which polls
the test Bot API server; pairing goes through the real ``lnk agent connect telegram``."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

from bridge_kit import (
    OWNER,
    TOKEN,
    bridge_log,
    connect,
    events,
    lnk_cmd,
    sent_texts,
    wait_for,
)
from telegram_api import BotApiServer

from lnk.agents import secrets
from lnk.agents.layout import Machine
from tests.agent_runner import Running, start_agent
from tests.procs import process_runs

__all__ = ["start_agent"]
STRANGER = 666


def _paired(home: Path, telegram: BotApiServer, start: Callable[..., Running]) -> Running:
    telegram.add_bot(TOKEN, username="work_bot")
    running = start("main")
    r = connect(
        home,
        telegram,
        before=lambda code: telegram.user_says(
            TOKEN, user_id=STRANGER, text="/start NOPE-NOPE", first_name="Eve"
        ),
    )
    assert r.returncode == 0, r.stderr
    assert "not the code" in r.stderr and "Eve" in r.stderr
    return running


def _lnk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}
    return subprocess.run(lnk_cmd(*args), env=env, capture_output=True, text=True, timeout=120)


def test_pair_then_only_the_owner_is_answered(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    _paired(home, telegram, start_agent)
    assert sent_texts(telegram) == ["Paired: main answers you here."]
    listed = json.loads(_lnk(home, "agent", "list", "--here", "--json").stdout)
    bots = listed["agents"][0]["bots"]
    assert bots["telegram"]["owner"] == OWNER and bots["telegram"]["username"] == "work_bot"
    assert TOKEN not in json.dumps(listed)
    # a stranger, the owner in a group, a group: never answered (as the owner or at all)
    telegram.user_says(TOKEN, user_id=STRANGER, text="I am the owner now")
    telegram.user_says(TOKEN, user_id=OWNER, chat_id=-100, chat_type="group", text="in a group")
    telegram.user_says(TOKEN, user_id=STRANGER, chat_id=-100, chat_type="group", text="hi all")
    telegram.user_says(TOKEN, user_id=OWNER, text="hello there")
    wait_for("the owner's answer", lambda: len(sent_texts(telegram)) == 2)
    assert "you said: hello there" in sent_texts(telegram)[1]
    assert [e["chat_id"] for e in telegram.sent(TOKEN)] == [OWNER, OWNER]
    assert [e["type"] for e in events(home, "main", f"telegram:{OWNER}")] == ["message", "answer"]
    assert bridge_log(home).count("not the owner's private chat, not answered") == 3
    wait_for("every update confirmed", lambda: telegram.pending(TOKEN) == [])


def test_foreign_text_never_raw_on_a_terminal(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    _paired(home, telegram, start_agent)
    evil = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\r\u202eoops"
    telegram.user_says(TOKEN, user_id=STRANGER, text=evil, first_name=evil)
    telegram.user_says(TOKEN, user_id=OWNER, text=evil)
    wait_for("the owner's answer", lambda: len(sent_texts(telegram)) == 2)
    assert evil in sent_texts(telegram)[1]  # the agent's own words go back as they are
    log = bridge_log(home)
    assert "\\x1b]52" in log
    for shown in (
        log,
        _lnk(home, "agent", "logs", "-n", "200").stdout,
        _lnk(home, "agent", "status").stdout + _lnk(home, "agent", "status").stderr,
    ):
        assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown


def test_answers_split_past_4096_code_points(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    _paired(home, telegram, start_agent)
    text = "😀 " * 2600  # 5,200 code points, 7,800 UTF-16 units
    telegram.user_says(TOKEN, user_id=OWNER, text=text)
    wait_for("both pieces", lambda: len(sent_texts(telegram)) == 3)
    pieces = sent_texts(telegram)[1:]
    assert all(len(p) <= 4096 for p in pieces) and len(pieces[0]) > 3000
    answer = events(home, "main", f"telegram:{OWNER}")[-1]["text"]
    assert "".join(pieces).replace(" ", "") == answer.replace(" ", "")


def test_409_429_and_a_dropped_answer(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    _paired(home, telegram, start_agent)
    telegram.conflict_next(TOKEN, 3)
    telegram.fail_next(TOKEN, "getUpdates", 1, retry_after=1)
    telegram.fail_next(TOKEN, "sendMessage", 1, retry_after=1)
    telegram.user_says(TOKEN, user_id=OWNER, text="through it all")
    wait_for("its answer", lambda: len(sent_texts(telegram)) == 2, bound=180)
    assert "you said: through it all" in sent_texts(telegram)[1]
    wait_for("the 409s met and logged", lambda: "(409): retrying" in bridge_log(home))
    # a sendMessage whose answer is lost half-way: carried out, recorded unknown, never again
    telegram.drop_next(TOKEN, "sendMessage")
    telegram.user_says(TOKEN, user_id=OWNER, text="lost answer")
    telegram.user_says(TOKEN, user_id=OWNER, text="after it")
    wait_for("the next answer", lambda: any("after it" in t for t in sent_texts(telegram)))
    assert sum("lost answer" in t for t in sent_texts(telegram)) == 1
    assert "unknown, never sent again" in bridge_log(home)


def test_huge_texts_refused_and_the_bridge_goes_on(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    _paired(home, telegram, start_agent)
    telegram.user_says(TOKEN, user_id=OWNER, text="x" * (10 << 20))  # 10 MB: no real Telegram's
    telegram.user_says(TOKEN, user_id=OWNER, text="y" * 20_000)  # past the bridge's bound
    telegram.user_says(TOKEN, user_id=OWNER, text="small")
    wait_for(
        "the small one answered", lambda: any("you said: small" in t for t in sent_texts(telegram))
    )
    texts = sent_texts(telegram)
    assert any("up to 16384 characters; this one has 20000" in t for t in texts)
    assert not any("xxxx" in t or "yyyy" in t for t in texts)
    assert "too large to read: refused" in bridge_log(home)
    assert all(len(e["text"]) < 500 for e in events(home, "main", f"telegram:{OWNER}")[:-1])


def test_a_ledger_edited_by_hand(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    running = _paired(home, telegram, start_agent)
    running.stop()
    ledger = running.agent.folders.connections / "telegram" / "ledger.sqlite"
    db = sqlite3.connect(ledger)
    # a row the bridge's own schema allows, for someone else's chat: never sent there
    db.execute(
        "INSERT INTO outbox VALUES ('tg-1', ?, 'answered', 'secret plans', 0, '', 0)", (STRANGER,)
    )
    db.commit()
    db.close()
    assert _lnk(home, "agent", "start", "--no-sandbox").returncode == 0
    try:
        telegram.user_says(TOKEN, user_id=OWNER, text="still here")
        wait_for("its answer", lambda: any("still here" in t for t in sent_texts(telegram)))
        assert all(e["chat_id"] == OWNER for e in telegram.sent(TOKEN))
        assert "not the owner's: never sent" in bridge_log(home)
        # a ledger that isn't one the bridge writes: refused whole, nothing polled, status
        # says so
        _lnk(home, "agent", "stop")
        db = sqlite3.connect(ledger)
        db.execute("UPDATE meta SET value='soon' WHERE key='offset'")
        db.commit()
        db.close()
        polls = len(telegram.calls(TOKEN, "getUpdates"))
        assert _lnk(home, "agent", "start", "--no-sandbox").returncode == 0
        wait_for("the refusal", lambda: "is not one the bridge wrote" in bridge_log(home))
        telegram.user_says(TOKEN, user_id=OWNER, text="waits")
        # the bridge writes what status shows just after its log line: waited for, not raced
        wait_for(
            "status saying so",
            lambda: "telegram: refused" in _lnk(home, "agent", "status").stdout,
        )
        assert len(telegram.calls(TOKEN, "getUpdates")) == polls
        # the hint's way out: disconnect, connect again; the message that waited is answered
        assert _lnk(home, "agent", "disconnect", "telegram").returncode == 0
        assert connect(home, telegram).returncode == 0
        assert telegram.pending(TOKEN) == []  # pairing confirms what waited (before it)
    finally:
        _lnk(home, "agent", "stop")  # started here, not by the fixture: stopped here


def test_disconnect_lets_go(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    running = _paired(home, telegram, start_agent)
    m = Machine(home)
    assert secrets.get(m, running.agent.id, "TELEGRAM_BOT_TOKEN") == TOKEN
    r = _lnk(home, "agent", "disconnect", "telegram")
    assert r.returncode == 0, r.stderr
    assert secrets.get(m, running.agent.id, "TELEGRAM_BOT_TOKEN") is None
    assert not (running.agent.folders.connections / "telegram").exists()
    polls = len(telegram.calls(TOKEN, "getUpdates"))
    telegram.user_says(TOKEN, user_id=OWNER, text="anyone?")
    again = _lnk(home, "agent", "disconnect", "telegram")
    assert again.returncode == 3 and again.stderr.count("lnk: error:") == 1
    assert "lnk: hint: lnk agent connect telegram --agent main" in again.stderr
    assert len(telegram.calls(TOKEN, "getUpdates")) <= polls + 1  # a poll under way ends
    assert len(sent_texts(telegram)) == 1


def test_the_bridge_lives_and_dies_with_its_runner(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    running = _paired(home, telegram, start_agent)
    pidfile = running.agent.runtime / "bridge.pid"
    first = int(wait_for("the bridge's pidfile", lambda: pidfile.exists() and pidfile.read_text()))
    assert Path(f"/proc/{first}/stat").read_text().split()[3] == str(running.proc.pid)
    os.kill(first, signal.SIGKILL)  # the runner starts it again
    second = wait_for(
        "a new bridge",
        lambda: pidfile.exists() and int(pidfile.read_text()) != first and int(pidfile.read_text()),
    )
    telegram.user_says(TOKEN, user_id=OWNER, text="after the kill")
    wait_for("its answer", lambda: any("after the kill" in t for t in sent_texts(telegram)))
    harness = int(running.endpoint["harness_pid"])
    os.kill(running.proc.pid, signal.SIGKILL)  # the runner: its bridge dies with it
    running.proc.wait()
    os.kill(harness, signal.SIGKILL)  # unsandboxed, the harness outlives a killed runner
    wait_for(
        "the bridge gone",
        lambda: not process_runs(second),
    )


def test_the_sandbox_neither_sees_nor_writes_the_bridges_state(home: Path) -> None:
    """Real bwrap: Agent/connections is bound nowhere in the sandbox; schedule/ is writable."""
    from lnk.agents import registry
    from lnk.sandbox.bwrap import check_bwrap, sandboxed

    a = registry.create(Machine(home), "boxed")
    ledger = a.folders.connections / "telegram" / "ledger.sqlite"
    ledger.parent.mkdir(parents=True)
    ledger.write_bytes(b"kept")
    script = (
        f"test -e {a.folders.connections} && echo SEEN; "
        f"echo x > {ledger} 2>/dev/null && echo WROTE; "
        f"echo 'message = \"x\"' > {a.folders.agent}/schedule/mine.toml && echo JOB"
    )
    r = sandboxed(a, ["/bin/sh", "-c", script], bwrap=check_bwrap(), runtime=False).run(
        capture_output=True, text=True, timeout=60
    )
    assert "SEEN" not in r.stdout and "WROTE" not in r.stdout and "JOB" in r.stdout, r
    assert ledger.read_bytes() == b"kept"
