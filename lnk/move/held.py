"""Messages held while an agent moves: ``~/.lnk/held/<id>/<message>.json``.

Link's own connection (``lnk agent chat send``) on the computer running a move
keeps a message sent during the switch here until the agent has it where it
went.  Each message carries an ID, and the harness answers an ID it already
answered with that answer, so a message handed over twice is answered once.
One that can never be delivered (its agent is gone) is shown whole.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.errors import AgentNotRunning, LnkError, NotFound, TransportError
from lnk.move import journal
from lnk.move.where import HERE, place_leg, where_is
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
    machine: Machine,
    name: str,
    thread: str,
    text: str,
    message_id: str,
    timeout: float = 300.0,
    place: str | None = None,
) -> str:
    """Send wherever the agent is now: here, or on its box through that box's own lnk.

    ``place`` is where the caller found the agent just now (resolved once per message).
    """
    if place is None:
        name, _, place = where_is(machine, name, ask_boxes=False)
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


def mover_alive(e: journal.Entry) -> bool:
    """Whether a running ``lnk`` holds this entry (a move under way, or one finishing it).

    Looked at by trying its lock and letting go at once, never keeping it.
    """
    if e.path is None:
        return False
    try:
        fd = os.open(e.path.with_suffix(".lock"), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing lets go of the lock
    return False


@dataclass
class ChatResult:
    agent: str
    thread: str
    message_id: str
    answer: str | None  # None while the message is held
    held: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def chat(
    machine: Machine,
    name: str | None,
    thread: str,
    text: str,
    message_id: str | None,
    say: Say,
    wait_s: float = 120.0,
) -> ChatResult:
    """``lnk agent chat send``: straight to the agent, or held while it moves.

    During a move under way (its switch takes seconds) the answer is waited for.
    When the move cannot finish now (the lnk running it is gone, or it takes
    longer than ``wait_s``), the message stays held and this returns at once
    with ``held``: the ``lnk agent start`` or ``lnk agent move`` that finishes the
    move, or ``lnk agent deliver``, hands it over.
    """
    name, agent_id, place = where_is(machine, name, ask_boxes=False)
    message_id = message_id or new_message_id()
    moving = journal.entries(machine, agent_id)
    if not moving or not moving[0].at_least("paused"):
        try:
            answer = send_to(machine, name, thread, text, message_id, place=place)
            return ChatResult(name, thread, message_id, answer)
        except (AgentNotRunning, TransportError):
            if not journal.entries(machine, agent_id):
                raise
    path = hold(machine, agent_id, name, thread, text, message_id)
    deadline = time.monotonic() + wait_s
    said = False
    while entries := journal.entries(machine, agent_id):
        if not any(mover_alive(e) for e in entries) or time.monotonic() >= deadline:
            say(
                f"{name}'s move ({entries[0].move}) cannot finish now; your message "
                f"{message_id} is held, and the lnk agent start or lnk agent move that "
                "finishes the move hands it over"
            )
            return ChatResult(name, thread, message_id, None, held=True)
        if not said:
            say(f"{name} is moving; your message is held and will be answered where it goes")
            said = True
        time.sleep(0.2)
    r = deliver_one(machine, path, say)
    if r is None:  # the move delivered it: ask again by ID for the same answer
        return ChatResult(
            name, thread, message_id, send_to(machine, name, thread, text, message_id)
        )
    if not r.get("delivered"):
        raise NotFound(f"{name} is gone; your message was not delivered")
    return ChatResult(name, thread, message_id, str(r["answer"]))


def deliver(machine: Machine, name: str | None, say: Say) -> list[dict[str, Any]]:
    """``lnk agent deliver``: hand the agent what was held for it, wherever it answers."""
    _, agent_id, _ = where_is(machine, name, ask_boxes=False)
    return deliver_all(machine, agent_id, say)
