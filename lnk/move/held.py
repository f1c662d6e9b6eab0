"""Messages held while an agent moves: ``~/.lnk/held/<id>/<message>.json``.

Link's own connection (``lnk agent chat send``) on the computer running a move
keeps a message sent during the switch here until the agent has it where it
went.  Each message carries an ID, and the harness answers an ID it already
answered with that answer, so a message handed over twice is answered once.
One that can never be delivered (its agent is gone) is shown whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.running import is_running, pid_alive
from lnk.errors import AgentNotRunning, LnkError, NotFound, TransportError
from lnk.harness.client import claim_unclaimed, send_message
from lnk.move import journal
from lnk.places.where import Whereabouts, where_is
from lnk.protocol import ChatAnswer, EarlierAnswer
from lnk.runtime import service
from lnk.text import one_line

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
    where: Whereabouts,
    thread: str,
    text: str,
    message_id: str,
    timeout: float = 300.0,
) -> tuple[str, tuple[EarlierAnswer, ...]]:
    """Send where the agent is (resolved once by the caller): here, or on its box through
    that box's own lnk.  Returns the answer and the box's earlier answers on the thread
    (its lnk hands them with this one; here they are taken by the caller)."""
    if where.here:
        a = registry.find(machine, where.name)
        key = service.endpoint_key(a)
        if key is None or not is_running(a):
            raise AgentNotRunning(
                f"{where.name} is not running", hint=f"lnk agent start --agent {where.name}"
            )
        answer = send_message(
            a.settings.endpoint_port, key, thread, text, timeout=timeout, message_id=message_id
        )
        return answer, ()
    short = thread.split(":", 1)[1] if thread.startswith("link:") else thread
    args = ["agent", "chat", "send", "--agent", where.name, "--thread", short]
    reply = where.leg.ask([*args, "--message-id", message_id, "--json", text], ChatAnswer)
    if reply.answer is None:
        raise TransportError(
            f"{where.name}'s box held the message instead of answering",
            hint=f"lnk box run {where.place} -- agent deliver --agent {where.name}",
        )
    return reply.answer, reply.earlier


def _answer_path(path: Path) -> Path:
    return path.with_name(path.name.replace(".json", ".answer.json"))


def _claim(path: Path) -> Path | None:
    """Take the held message for delivering (renamed to ``<message>.json.by-<pid>``), so
    of two lnks finishing one move, one delivers it; None if another has it."""
    claimed = path.with_name(f"{path.name}.by-{os.getpid()}")
    try:
        os.rename(path, claimed)
    except OSError:
        return None
    return claimed


def _release_stale(d: Path) -> None:
    """A claim whose lnk died mid-delivery goes back to being held."""
    for p in d.glob("msg-*.json.by-*"):
        pid = p.name.rsplit("-", 1)[1]
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                os.rename(p, p.with_name(p.name.split(".by-")[0]))


def deliver_one(machine: Machine, path: Path, say: Say) -> dict[str, Any] | None:
    """Hand one held message over where its agent answers now; its answer is kept beside
    it (``<message>.answer.json``) for whoever waits for it, until taken.  None when
    another lnk delivers it (or did)."""
    claimed = _claim(path)
    if claimed is None:
        return None
    try:
        msg = json.loads(claimed.read_text())
        try:
            where = where_is(machine, msg["agent"], ask_boxes=False)
            answer, earlier = send_to(machine, where, msg["thread"], msg["text"], msg["id"])
        except NotFound:
            say(
                f"a message for {msg['agent']} can't be delivered (the agent is gone); here "
                f"it is whole, sent {time.ctime(msg['at'])} on {msg['thread']}:\n{msg['text']}"
            )
            claimed.unlink(missing_ok=True)
            return {"id": msg["id"], "delivered": False, "text": msg["text"]}
    except BaseException:
        with contextlib.suppress(OSError):
            os.rename(claimed, path)  # held again: the next start, move or deliver tries again
        raise
    done = {"id": msg["id"], "delivered": True, "thread": msg["thread"], "answer": answer}
    kept = done | {"text": msg["text"], "at": msg["at"], "earlier": [e.to_json() for e in earlier]}
    out = _answer_path(path)
    tmp = out.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(kept))
    os.replace(tmp, out)
    claimed.unlink(missing_ok=True)
    return done


def _take(p: Path) -> dict[str, Any] | None:
    """A kept answer, taken: renamed away first, so of two takers one gets it."""
    taken = p.with_suffix(f".taken-{os.getpid()}")
    try:
        os.rename(p, taken)
    except OSError:
        return None
    try:
        data = json.loads(taken.read_text())
    except (OSError, ValueError):
        data = None
    taken.unlink(missing_ok=True)
    return data if isinstance(data, dict) else None


def _being_delivered(path: Path) -> bool:
    return any(path.parent.glob(f"{path.name}.by-*"))


def _earlier_of(data: dict[str, Any]) -> tuple[EarlierAnswer, ...]:
    """The earlier answers a box handed over with a held message's delivery."""
    rows = data.get("earlier")
    out: list[EarlierAnswer] = []
    for row in rows[:100] if isinstance(rows, list) else ():
        with contextlib.suppress(LnkError, ValueError):
            out.append(EarlierAnswer.from_json(row, "a kept earlier answer"))
    return tuple(out)


def take_answer(
    machine: Machine, agent_id: str, message_id: str
) -> tuple[str, tuple[EarlierAnswer, ...]] | None:
    """The answer a delivery kept for ``message_id`` (and the earlier answers that came with
    it), taken, so it is handed over once."""
    data = _take(_answer_path(machine.held_dir / agent_id / f"{message_id}.json"))
    if data is None or not isinstance(data.get("answer"), str):
        return None
    return data["answer"], _earlier_of(data)


def take_earlier(machine: Machine, agent_id: str, thread: str) -> tuple[EarlierAnswer, ...]:
    """The answers kept for this thread that nobody waited for (their chat returned while
    the message was held), taken, oldest first: the next chat on the thread hands them
    over, once."""
    d = machine.held_dir / agent_id
    if not d.is_dir():
        return ()
    found: list[tuple[float, tuple[EarlierAnswer, ...]]] = []
    for p in d.glob("msg-*.answer.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(p.read_text()).get("thread") != thread:
                continue
        data = _take(p)
        if data is None:
            continue
        with contextlib.suppress(KeyError, TypeError, ValueError):
            mine = EarlierAnswer(str(data["id"]), str(data["text"]), str(data["answer"]))
            found.append((float(data.get("at", 0)), (*_earlier_of(data), mine)))
    return tuple(e for _, es in sorted(found, key=lambda f: f[0]) for e in es)


def take_unclaimed(machine: Machine, where: Whereabouts, thread: str) -> tuple[EarlierAnswer, ...]:
    """The thread's answers the running agent made after their caller went (a Ctrl-C'd
    chat, a turn its crash left), each handed over once.  An agent here only: one on a box
    hands them to its own lnk's chat.  A harness that does not keep them (404) has none."""
    if not where.here:
        return ()
    a = registry.find(machine, where.name)
    key = service.endpoint_key(a)
    if key is None or not is_running(a):
        return ()
    try:
        rows = claim_unclaimed(a.settings.endpoint_port, key, thread, timeout=30.0)
    except LnkError:
        return ()
    return tuple(
        EarlierAnswer(str(r.get("id", r.get("message", ""))), str(r.get("text", "")), r["answer"])
        for r in rows
    )


def deliver_all(machine: Machine, agent_id: str, say: Say) -> list[dict[str, Any]]:
    d = machine.held_dir / agent_id
    out: list[dict[str, Any]] = []
    if not d.is_dir():
        return out
    _release_stale(d)
    for p in sorted(d.glob("msg-*[0-9a-f].json"), key=lambda p: p.stat().st_mtime):
        try:
            r = deliver_one(machine, p, say)
        except LnkError as e:
            say(f"a held message for the agent stays held ({e}); lnk agent deliver hands it over")
            continue
        if r:
            out.append(r)
            if r.get("delivered"):
                say(
                    f"delivered a message held during the move ({r['id']} on {r['thread']}); "
                    f"its answer: {one_line(str(r['answer']), 2000)} (the next chat on "
                    f"{r['thread']} hands it over too)"
                )
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


def chat(
    machine: Machine,
    name: str | None,
    thread: str,
    text: str,
    message_id: str | None,
    say: Say,
    wait_s: float = 120.0,
) -> ChatAnswer:
    """``lnk agent chat send``: straight to the agent, or held while it moves.

    During a move under way (its switch takes seconds) the answer is waited for.
    When the move cannot finish now (the lnk running it is gone, or it takes
    longer than ``wait_s``), the message stays held and this returns at once
    with ``held``: the ``lnk agent start`` or ``lnk agent move`` that finishes the
    move, or ``lnk agent deliver``, hands it over.
    """
    where = where_is(machine, name, ask_boxes=False)
    name, agent_id = where.name, where.id
    message_id = message_id or new_message_id()
    moving = journal.entries(machine, agent_id)
    if not moving or not moving[0].at_least("paused"):
        try:
            answer, came = send_to(machine, where, thread, text, message_id)
            earlier = take_earlier(machine, agent_id, thread) + came
            earlier += take_unclaimed(machine, where, thread)
            return ChatAnswer(name, thread, message_id, answer, earlier=earlier)
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
            return ChatAnswer(name, thread, message_id, None, held=True)
        if not said:
            say(f"{name} is moving; your message is held and will be answered where it goes")
            said = True
        time.sleep(0.2)
    r = deliver_one(machine, path, say)  # the move ended without handing it over: here
    if r is not None and not r.get("delivered"):
        raise NotFound(f"{name} is gone; your message was not delivered")
    kept = take_answer(machine, agent_id, message_id)
    deadline = time.monotonic() + wait_s
    while kept is None and r is None and _being_delivered(path) and time.monotonic() < deadline:
        time.sleep(0.1)  # another lnk hands it over now: its answer comes beside it
        kept = take_answer(machine, agent_id, message_id)
    if kept is None:  # taken by another lnk meanwhile: the harness answers an ID once, again
        where = where_is(machine, name, ask_boxes=False)
        kept = send_to(machine, where, thread, text, message_id)
    answer, came = kept
    return ChatAnswer(
        name, thread, message_id, answer, earlier=take_earlier(machine, agent_id, thread) + came
    )


def deliver(machine: Machine, name: str | None, say: Say) -> list[dict[str, Any]]:
    """``lnk agent deliver``: hand the agent what was held for it, wherever it answers."""
    return deliver_all(machine, where_is(machine, name, ask_boxes=False).id, say)
