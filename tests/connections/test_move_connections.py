"""An agent connected to Telegram, with a job, moved between this computer and a box while
its owner writes every 100 ms: each message answered once, each slot fired once."""

from __future__ import annotations

import tomllib

from bridge_kit import TOKEN, People, answered_once, connect, sent_texts, wait_for
from telegram_api import BotApiServer

from tests.move.move_helpers import AGENT, HERE, World, make_agent


def _epoch(world: World, place: str) -> int:
    path = world.home_of(place) / ".config" / "lnk" / "agents" / f"{AGENT}.toml"
    return int(tomllib.loads(path.read_text())["epoch"])


def test_move_there_and_back(world: World, telegram: BotApiServer) -> None:
    telegram.add_bot(TOKEN, username="work_bot")
    make_agent(world)
    r = connect(world.here, telegram, AGENT)
    assert r.returncode == 0, r.stderr
    with People(telegram, "a") as people:
        wait_for("a first answer", lambda: len(sent_texts(telegram)) > 3)
        world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
        n = len(sent_texts(telegram))
        wait_for("answers from b1", lambda: len(sent_texts(telegram)) > n + 5)
        assert _epoch(world, "b1") == 1  # the commit there raised it
        world.ok("agent", "move", "--agent", AGENT, "--here")
        people.stop()
    assert _epoch(world, HERE) == 2
    assert not list((world.here / ".lnk" / "agents").glob("*/connections.hold"))
    texts = list(people.sent.values())
    wait_for(
        "every message answered",
        lambda: all(f"you said: {t} (" in "\n".join(sent_texts(telegram)) for t in texts),
        bound=240,
    )
    print(answered_once(telegram, texts, set()))
