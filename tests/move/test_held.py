"""Held messages are given: a chat during a move that cannot finish now is held and
returns at once; the start or move that finishes the move hands it over."""

from __future__ import annotations

from move_helpers import AGENT, HERE, World, answered_once, make_agent


def _stuck_move(world: World, point: str) -> str:
    """A move whose mover died at ``point``: its journal entry stays, nothing runs it."""
    agent_id = make_agent(world)
    r = world.lnk("agent", "move", "--agent", AGENT, "--to", "b1", env={"LNK_FAULT": point})
    assert r.code != 0, "the fault did not fire"
    assert not world.journal_empty()
    return agent_id


def _held_chat(world: World, text: str) -> None:
    # a bound, not a timing: a chat that waited for the stuck move would never come back
    r = world.lnk("agent", "chat", "send", "--agent", AGENT, "--json", text, timeout=60)
    assert r.code == 0, r.err
    answer = r.json()
    assert answer["held"] is True and answer["answer"] is None, answer
    assert "cannot finish now" in r.err and "lnk agent start" in r.err, r.err
    held = list((world.here / ".lnk" / "held").rglob("msg-*.json"))
    assert [p.stem for p in held] == [answer["message_id"]]


def _next_chat_hands_over(world: World, text: str) -> None:
    """The answer nobody waited for comes with the next chat on its thread, once."""
    r = world.ok("agent", "chat", "send", "--agent", AGENT, "next")
    assert "your earlier message" in r.err and text in r.err, r.err
    assert text in r.out.splitlines()[0] and "next" in r.out.splitlines()[-1], r.out
    again = world.ok("agent", "chat", "send", "--agent", AGENT, "--json", "again")
    assert again.json()["earlier"] == []


def test_start_that_finishes_a_move_delivers_what_was_held(world: World) -> None:
    agent_id = _stuck_move(world, "move:after-pause")  # undone: it answers here again
    _held_chat(world, "while-stuck")
    started = world.ok("agent", "start", "--agent", AGENT)
    assert "delivered a message held during the move" in started.err, started.err
    assert world.journal_empty() and world.held_empty()
    assert world.exactly_one(agent_id) == HERE
    answered_once(world, HERE, ["while-stuck"])
    _next_chat_hands_over(world, "while-stuck")


def test_move_that_finishes_a_move_delivers_what_was_held(world: World) -> None:
    agent_id = _stuck_move(world, "move:after-commit")  # finished forward: it answers on b1
    _held_chat(world, "before-finish")
    moved = world.ok("agent", "move", "--agent", AGENT, "--here", "--json")
    assert "delivered a message held during the move" in moved.err, moved.err
    assert world.journal_empty() and world.held_empty()
    assert world.exactly_one(agent_id) == HERE
    answered_once(world, HERE, ["before-finish"])  # answered on b1, carried back here
    _next_chat_hands_over(world, "before-finish")
