"""Messages held while an agent moves: ``~/.lnk/held/<id>/<message>.json``.

Link's own connection (``lnk agent chat send``) on the computer running a move
keeps a message sent during the switch here until the agent has it where it
went.  Each message carries an ID, and the harness answers an ID it already
answered with that answer, so a message handed over twice is answered once.
One that can never be delivered (its agent is gone) is shown whole.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.errors import AgentNotRunning, LnkError, NotFound, TransportError
from lnk.runtime import service

Say = Callable[[str], None]


def new_message_id() -> str:
    return "msg-" + secrets.token_hex(8)


def hold(
    machine: Machine, agent_id: str, name: str, thread: str, text: str, message_id: str
) -> Path:
    d = machine.held_dir / agent_id
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    p = d / f"{message_id}.json"
    p.write_text(
        json.dumps(
            {
                "id": message_id,
                "agent": name,
                "agent_id": agent_id,
                "thread": thread,
                "text": text,
                "at": time.time(),
            }
        )
    )
    return p


def send_to(
    machine: Machine, name: str, thread: str, text: str, message_id: str, timeout: float = 300.0
) -> str:
    """Send wherever the agent is now: here, or on its box through that box's own lnk."""
    from lnk.move.move import HERE, place_leg, where_is

    name, _, place = where_is(machine, name)
    if place == HERE:
        from lnk.harness.client import send_message

        a = registry.find(machine, name)
        key = service.endpoint_key(a)
        if key is None or not service.is_running(a):
            raise AgentNotRunning(f"{name} is not running", hint=f"lnk agent start --agent {name}")
        return send_message(
            a.settings.endpoint_port, key, thread, text, timeout=timeout, message_id=message_id
        )
    leg = place_leg(machine, place)
    short = thread.split(":", 1)[1] if thread.startswith("link:") else thread
    out = leg.run(
        [
            "agent",
            "chat",
            "send",
            "--agent",
            name,
            "--thread",
            short,
            "--message-id",
            message_id,
            "--json",
            text,
        ]
    ).stdout
    return str(json.loads(out)["answer"])


def deliver_one(machine: Machine, path: Path, say: Say) -> dict[str, Any] | None:
    try:
        msg = json.loads(path.read_text())
    except FileNotFoundError:
        return None  # delivered by another process meanwhile
    try:
        answer = send_to(machine, msg["agent"], msg["thread"], msg["text"], msg["id"])
    except NotFound:
        say(
            f"a message for {msg['agent']} can't be delivered (the agent is gone); here it is "
            f"whole, sent {time.ctime(msg['at'])} on {msg['thread']}:\n{msg['text']}"
        )
        path.unlink(missing_ok=True)
        return {"id": msg["id"], "delivered": False, "text": msg["text"]}
    path.unlink(missing_ok=True)
    return {"id": msg["id"], "delivered": True, "thread": msg["thread"], "answer": answer}


def deliver_all(machine: Machine, agent_id: str, say: Say) -> list[dict[str, Any]]:
    d = machine.held_dir / agent_id
    out: list[dict[str, Any]] = []
    if not d.is_dir():
        return out
    for p in sorted(d.glob("msg-*.json"), key=lambda p: p.stat().st_mtime):
        try:
            r = deliver_one(machine, p, say)
        except LnkError as e:
            say(f"a held message for the agent stays held ({e}); lnk agent deliver hands it over")
            continue
        if r:
            out.append(r)
            if r.get("delivered"):
                say(f"delivered a message held during the move ({r['id']})")
    return out


def chat(
    machine: Machine,
    name: str | None,
    thread: str,
    text: str,
    message_id: str | None,
    say: Say,
    wait_s: float = 900.0,
) -> str:
    """``lnk agent chat send``: straight to the agent, or held while it moves."""
    from lnk.move import journal
    from lnk.move.move import where_is

    name, agent_id, _ = where_is(machine, name)
    message_id = message_id or new_message_id()
    moving = journal.entries(machine, agent_id)
    if not moving or not moving[0].at_least("paused"):
        try:
            return send_to(machine, name, thread, text, message_id)
        except (AgentNotRunning, TransportError):
            if not journal.entries(machine, agent_id):
                raise
    path = hold(machine, agent_id, name, thread, text, message_id)
    say(f"{name} is moving; your message is held and will be answered where it goes")
    deadline = time.monotonic() + wait_s
    while journal.entries(machine, agent_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    r = deliver_one(machine, path, say)
    if r is None:  # the move delivered it: ask again by ID for the same answer
        return send_to(machine, name, thread, text, message_id)
    if not r.get("delivered"):
        raise NotFound(f"{name} is gone; your message was not delivered")
    return str(r["answer"])
