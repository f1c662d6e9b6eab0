"""A real Hermes agent carried by lnk: moved here → box → here, backed up and restored on a
fresh machine; Hermes's own state (state.db's sessions and messages, memories, skills,
cron jobs) equal after each, and the conversation goes on in the same Hermes session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from lnkrun import lnk
from servers import ModelServer
from test_hermes_agent import KEY, chat, create_hermes, hermes_home, ok, rows

from tests.move.move_helpers import AGENT, Chatter, World, kill_agents


@pytest.fixture
def world(hermes: Path, home: Path, tmp_path: Path) -> Iterator[World]:
    w = World(here=home)
    w.add_local_box("b1", tmp_path / "b1-home")
    try:
        yield w
    finally:
        kill_agents([w.here, *w.boxes.values()])


def put_state(home: Path) -> dict[str, bytes]:
    """Hermes's memories, a skill and a cron job, as Hermes keeps them in its home."""
    h = hermes_home(home, AGENT)
    files = {
        "memories/MEMORY.md": b"The person likes short answers.\n",
        "memories/USER.md": b"Name: Ada\n",
        "skills/notes/take-notes/SKILL.md": b"---\nname: take-notes\n---\nWrite notes.\n",
        "cron/jobs.json": json.dumps({"jobs": [{"id": "j1", "prompt": "daily"}]}).encode(),
    }
    for rel, data in files.items():
        (h / rel).parent.mkdir(parents=True, exist_ok=True)
        (h / rel).write_bytes(data)
    return files


def files_of(home: Path, names: dict[str, bytes]) -> dict[str, bytes]:
    return {rel: (hermes_home(home, AGENT) / rel).read_bytes() for rel in names}


def user_said(model: ModelServer) -> list[str]:
    last = [r for r in model.requests if r["path"].endswith("/chat/completions")][-1]
    return [m["content"] for m in last["body"]["messages"] if m["role"] == "user"]


def start_chatting(home: Path, model: ModelServer) -> None:
    create_hermes(home, model, AGENT)
    r = lnk("agent", "secret", "set", "TEST_KEY", "--agent", AGENT, home=home, input=KEY + "\n")
    assert r.code == 0, r.err
    ok("agent", "start", "--agent", AGENT, home=home)
    assert chat(home, "one", AGENT) == "tm heard one"


def test_a_hermes_agent_moves_to_a_box_and_back_and_its_conversation_goes_on(
    world: World, model: ModelServer
) -> None:
    here, box = world.here, world.boxes["b1"]
    start_chatting(here, model)
    made = put_state(here)
    before = rows(here, AGENT)
    assert len(before["sessions"]) == 1 and len(before["messages"]) == 2

    world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
    assert not (here / "Link" / "Agents" / AGENT).exists()
    assert rows(box, AGENT) == before  # state.db's rows, as they were
    assert files_of(box, made) == made
    assert chat(here, "two", AGENT) == "tm heard two"  # answered there
    assert user_said(model)[-2:] == ["one", "two"]  # the same Hermes session, resumed
    there = rows(box, AGENT)
    assert there["sessions"] == before["sessions"] and len(there["messages"]) == 4

    world.ok("agent", "move", "--agent", AGENT, "--here")
    assert rows(here, AGENT) == there
    assert files_of(here, made) == made
    assert chat(here, "three", AGENT) == "tm heard three"
    assert user_said(model)[-3:] == ["one", "two", "three"]
    assert rows(here, AGENT)["sessions"] == before["sessions"]


def test_a_hermes_agent_backed_up_running_restores_on_a_fresh_machine(
    hermes: Path, model: ModelServer, home: Path, tmp_path: Path
) -> None:
    start_chatting(home, model)
    made = put_state(home)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    url = f"file://{bucket}"
    ok("agent", "backup", "--agent", AGENT, "--to", url, home=home)  # while it runs (WAL)
    before = rows(home, AGENT)
    ok("agent", "stop", "--agent", AGENT, home=home)

    fresh = tmp_path / "fresh-home"
    fresh.mkdir()
    key = ok("backup", "key", "export", home=home).out
    r = lnk("backup", "key", "import", home=fresh, input=key)
    assert r.code == 0, r.err
    ok("agent", "restore", AGENT, "--from", url, home=fresh)
    assert rows(fresh, AGENT) == before
    assert files_of(fresh, made) == made
    r = lnk("agent", "secret", "set", "TEST_KEY", "--agent", AGENT, home=fresh, input=KEY + "\n")
    assert r.code == 0, r.err
    # a restore on a fresh machine thinks with what that machine reaches: Hermes refuses
    # to start without a model, saying so; given one, it goes on where it stopped
    r = lnk("agent", "start", "--agent", AGENT, home=fresh)
    assert r.code != 0 and "Hermes needs an OpenAI-compatible model" in r.err, r.err
    ok("agent", "model", "--agent", AGENT, "test-model", "--model-url", model.base_url,
       "--key-env", "TEST_KEY", home=fresh)  # fmt: skip
    ok("agent", "allow", "--agent", AGENT, "--port", str(model.port), home=fresh)
    ok("agent", "start", "--agent", AGENT, home=fresh)
    try:
        assert chat(fresh, "after restore", AGENT) == "tm heard after restore"
        assert user_said(model)[-2:] == ["one", "after restore"]
        assert rows(fresh, AGENT)["sessions"] == before["sessions"]
    finally:
        ok("agent", "stop", "--agent", AGENT, home=fresh)


def test_a_move_while_the_person_chats_loses_no_message_and_answers_none_twice(
    world: World, model: ModelServer
) -> None:
    here, box = world.here, world.boxes["b1"]
    start_chatting(here, model)
    with Chatter(world, "m") as chatter:
        world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
        chatter.stop()
    after_there = list(chatter.sent)
    with Chatter(world, "n") as back:
        world.ok("agent", "move", "--agent", AGENT, "--here")
        back.stop()
    for c in (chatter, back):
        assert not c.failed, c.failed
        for text, said in c.answers.items():
            assert said == f"tm heard {text}"
    # what a later chat hands over (answers nobody waited for), once each
    r = world.lnk("agent", "chat", "send", "--agent", AGENT, "--json", "last", timeout=300)
    assert r.code == 0, r.err
    handed = {e["text"]: e["answer"] for e in r.json().get("earlier", [])}
    for c in (chatter, back):
        for text, got in c.earlier.items():
            handed.setdefault(text, got[0])
            assert len(got) == 1
    assert sorted(handed) == sorted(chatter.held + back.held)
    assert all(a == f"tm heard {t}" for t, a in handed.items())
    assert world.held_empty()
    # Hermes's own record: one session, each message once, each answered once, in order
    state = rows(here, AGENT)
    assert len(state["sessions"]) == 1
    said = [(role, text) for _, role, text in state["messages"]]
    sent = ["one", *after_there, *back.sent, "last"]
    assert [t for role, t in said if role == "user"] == sent
    assert [t for role, t in said if role == "assistant"] == [f"tm heard {t}" for t in sent]
    assert not (box / "Link" / "Agents" / AGENT).exists()
