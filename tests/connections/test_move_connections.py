"""An agent connected to Telegram, with a job, moved between this computer and a box while
its owner writes every 100 ms: each message answered once, each slot fired once."""

from __future__ import annotations

from bridge_kit import TOKEN, People, answered_once, connect, sent_texts, wait_for
from telegram_api import BotApiServer

from tests.move.move_helpers import AGENT, World, make_agent


def test_move_there_and_back(world: World, telegram: BotApiServer) -> None:
    telegram.add_bot(TOKEN, username="work_bot")
    make_agent(world)
    r = connect(world.here, telegram, AGENT)
    assert r.returncode == 0, r.stderr
    with People(telegram, "a") as people:
        wait_for("a first answer", lambda: len(sent_texts(telegram)) > 3)
        world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
        wait_for("answers from b1", lambda: len(sent_texts(telegram)) > len(people.sent) // 2)
        world.ok("agent", "move", "--agent", AGENT, "--here")
        people.stop()
    texts = list(people.sent.values())
    wait_for(
        "every message answered",
        lambda: all(any(f"you said: {t} (" in s for s in sent_texts(telegram)) for t in texts[-3:]),
    )
    print(answered_once(telegram, texts, set()))
