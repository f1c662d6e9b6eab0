"""The Telegram connection end to end: a real runner starts the agent's bridge, which polls
the test Bot API server; pairing goes through the real ``lnk agent connect telegram``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bridge_kit import OWNER, TOKEN, connect, events, sent_texts, wait_for
from telegram_api import BotApiServer

from tests.agent_runner import Running, start_agent

__all__ = ["start_agent"]


def test_pair_then_the_owner_is_answered(
    home: Path, telegram: BotApiServer, start_agent: Callable[..., Running]
) -> None:
    telegram.add_bot(TOKEN, username="work_bot")
    start_agent("main")
    r = connect(home, telegram)
    assert r.returncode == 0, r.stderr
    assert sent_texts(telegram) == ["Paired: main answers you here."]
    telegram.user_says(TOKEN, user_id=OWNER, text="hello there")
    wait_for("the answer", lambda: len(sent_texts(telegram)) == 2)
    assert "you said: hello there" in sent_texts(telegram)[1]
    evs = events(home, "main", f"telegram:{OWNER}")
    assert [e["type"] for e in evs] == ["message", "answer"]
