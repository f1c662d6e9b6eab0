"""Conversations: one turn at a time, each message and answer kept as events.

A conversation is the events collection named by its thread (``link:main``).
Events are JSON objects with a ``type``:

    {"type": "message", "from": "owner", "text": ..., "at": ...}
    {"type": "answer", "text": ..., "reply_to": N, "at": ..., ["recovered": true]}
    {"type": "tool_call", "call_id": ..., "tool": ..., "args": {...}}
    {"type": "tool_result", "call_id": ..., "made": false, "text": "not made: ..."}
    {"type": "unclaimed", "answer": N}     the answer N's caller went before it came
    {"type": "claimed", "answer": N}       ... and a later chat on the thread took it

Every event is written conditionally on its number (a loser reads again).  A
turn holds the conversation's lease, renewed every ``renew_s`` while it runs;
a lease taken over from a holder that lapsed means a turn crashed, so its
unanswered tool calls are answered as not made and its unanswered message is
answered before the new message is taken in.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from lnk import logs
from lnk.collections.base import CollectionId, Store
from lnk.errors import LnkError, Refused
from lnk.harness.model import HISTORY_TURNS, Model, Turn

log = logs.get("harness")

NOT_MADE = "not made: the turn that called it stopped before the call answered"
POLL_S = 0.05


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def new_holder() -> str:
    """A lease holder unique to this process (pids repeat inside pid namespaces)."""
    return f"harness-{socket.gethostname()}-{secrets.token_hex(6)}"


def append_event(store: Store, cid: CollectionId, data: dict[str, Any]) -> int:
    """Append as the next number; on losing a race, read the last number again."""
    while True:
        n = store.last_number(cid) + 1
        if store.append(cid, n, data):
            return n


DEDUP_WINDOW = 1000  # events searched for a repeated message ID


class Busy(Refused):
    """Another process holds the conversation's turn and keeps renewing it."""


class Conversations:
    def __init__(
        self,
        store: Store,
        agent_name: str,
        model: Model,
        *,
        renew_s: float,
        holder: str | None = None,
        wait_s: float | None = None,
    ) -> None:
        self.store = store
        self.agent_name = agent_name
        self.model = model
        self.renew_s = max(0.05, float(renew_s))
        self.holder = holder or new_holder()
        # how long a message waits for another process's turn: past a lapse it is ours
        self.wait_s = wait_s if wait_s is not None else store.lapse_ms / 1000 + 5
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._active = 0
        self._idle = threading.Condition()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no turn runs (a stop lets the running turn end); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def _lock(self, thread: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(thread, threading.Lock())

    @contextmanager
    def turn(self, cid: CollectionId) -> Iterator[bool]:
        """Hold the conversation's lease; yields whether it was taken over from a crash."""
        deadline = time.monotonic() + self.wait_s
        while True:
            lease = self.store.take_lease(cid, self.holder)
            if lease is not None:
                break
            if time.monotonic() > deadline:
                raise Busy(
                    f"the conversation {cid.name} is in another process's turn",
                    hint="send again when that turn has answered",
                )
            time.sleep(POLL_S)
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(self.renew_s):
                try:
                    self.store.renew_lease(cid, self.holder)
                except Exception as e:  # keep renewing; the log shows why one failed
                    log.warning("renewing the turn of %s failed: %s", cid.name, e)

        renewer = threading.Thread(target=renew, name=f"renew {cid.name}", daemon=True)
        renewer.start()
        try:
            yield lease.took_over
        finally:
            stop.set()
            renewer.join()
            self.store.release_lease(cid, self.holder)

    def handle(
        self, thread: str, text: str, sender: str = "owner", message_id: str | None = None
    ) -> dict[str, Any]:
        """Take one message in and answer it: ``{"text", "thread", "message", "number"}``.

        A message whose ID was answered already gets that answer again, with no new
        turn: a message handed over twice (a move's held message) is answered once.
        """
        cid = CollectionId("events", thread)
        with self._idle:
            self._active += 1
        try:
            with self._lock(thread), self.turn(cid) as took_over:
                if took_over:
                    self.finish_crashed_turn(cid)
                if message_id is not None:
                    prior = self._answered(cid, message_id)
                    if prior is not None:
                        return prior
                data: dict[str, Any] = {
                    "type": "message",
                    "from": sender,
                    "text": text,
                    "at": iso_now(),
                }
                if message_id is not None:
                    data["id"] = message_id
                msg_n = append_event(store=self.store, cid=cid, data=data)
                answer = self._answer(cid, text, msg_n)
                ans_n = append_event(
                    self.store,
                    cid,
                    {"type": "answer", "text": answer, "reply_to": msg_n, "at": iso_now()},
                )
            return {"thread": thread, "text": answer, "message": msg_n, "number": ans_n}
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def _answered(self, cid: CollectionId, message_id: str) -> dict[str, Any] | None:
        """The answer to the message with this ID, among the recent events."""
        last = self.store.last_number(cid)
        msg_n = None
        for ev in self.store.iter_events(cid, max(1, last - DEDUP_WINDOW), last + 1):
            if ev.data.get("type") == "message" and ev.data.get("id") == message_id:
                msg_n = ev.number
            elif (
                msg_n is not None
                and ev.data.get("type") == "answer"
                and ev.data.get("reply_to") == msg_n
            ):
                return {
                    "thread": cid.name,
                    "text": ev.data.get("text", ""),
                    "message": msg_n,
                    "number": ev.number,
                    "repeated": True,
                }
        return None

    def _answer(self, cid: CollectionId, text: str, msg_n: int) -> str:
        first = max(1, msg_n - HISTORY_TURNS)
        history = [ev.data for ev in self.store.iter_events(cid, first, msg_n)]
        count = sum(
            1
            for ev in self.store.iter_events(cid, 1, msg_n + 1)
            if ev.data.get("type") == "message"
        )
        return self.model.answer(Turn(self.agent_name, cid.name, history, text, count))

    def finish_crashed_turn(self, cid: CollectionId) -> list[int]:
        """Answer the crashed turn's open tool calls as not made, and its open message.

        Returns the numbers of the events written.  A turn that had answered every
        message and call writes nothing: its lease is only let go.
        """
        open_calls: dict[str, dict[str, Any]] = {}
        pending: tuple[int, str] | None = None
        for ev in self.store.iter_events(cid):
            kind = ev.data.get("type")
            if kind == "message":
                pending = (ev.number, str(ev.data.get("text", "")))
            elif kind == "answer":
                pending = None
            elif kind == "tool_call":
                open_calls[str(ev.data.get("call_id"))] = ev.data
            elif kind == "tool_result":
                open_calls.pop(str(ev.data.get("call_id")), None)
        written = []
        for call_id, call in open_calls.items():
            written.append(
                append_event(
                    self.store,
                    cid,
                    {
                        "type": "tool_result",
                        "call_id": call_id,
                        "tool": call.get("tool"),
                        "made": False,
                        "text": NOT_MADE,
                        "at": iso_now(),
                    },
                )
            )
        if pending is not None:
            num, text = pending
            try:
                answer = self._answer(cid, text, num)
            except LnkError as e:
                answer = f"(the turn that took this message in stopped; answering failed: {e})"
            ans_n = append_event(
                self.store,
                cid,
                {
                    "type": "answer",
                    "text": answer,
                    "reply_to": num,
                    "recovered": True,
                    "at": iso_now(),
                },
            )
            written.append(ans_n)
            # its caller went with the crashed turn: the next chat on the thread takes it
            written.append(append_event(self.store, cid, {"type": "unclaimed", "answer": ans_n}))
        if written:
            log.info(
                "finished a crashed turn in %s: %d tool call(s) answered as not made",
                cid.name,
                len(open_calls),
            )
        return written


def _claimable(store: Store, cid: CollectionId) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """The answers marked unclaimed and not claimed since: (number, answer, its message)."""
    last = store.last_number(cid)
    events = {ev.number: ev.data for ev in store.iter_events(cid, max(1, last - DEDUP_WINDOW))}
    open_: dict[int, None] = {}
    for data in events.values():
        n = data.get("answer")
        if not isinstance(n, int):
            continue
        if data.get("type") == "unclaimed":
            open_[n] = None
        elif data.get("type") == "claimed":
            open_.pop(n, None)
    out = []
    for n in open_:
        ans = events.get(n)
        if ans is None or ans.get("type") != "answer":
            continue
        out.append((n, ans, events.get(ans.get("reply_to", -1), {})))
    return out


def mark_unclaimed(convs: Conversations, thread: str, answer_n: int) -> None:
    """The answer ``answer_n`` was made after its caller went (Ctrl-C, a crash)."""
    cid = CollectionId("events", thread)
    with convs._lock(thread):
        append_event(convs.store, cid, {"type": "unclaimed", "answer": answer_n})


def claim(convs: Conversations, thread: str, only: int | None = None) -> list[dict[str, Any]]:
    """Hand over the thread's answers nobody waited for, each once: they are marked claimed
    as they are handed (``{"number", "message", "id", "text", "answer"}``, oldest first).
    ``only``: just that answer (its caller came back with the same message ID)."""
    cid = CollectionId("events", thread)
    out: list[dict[str, Any]] = []
    with convs._lock(thread):
        for n, ans, msg in _claimable(convs.store, cid):
            if only is not None and n != only:
                continue
            append_event(convs.store, cid, {"type": "claimed", "answer": n, "at": iso_now()})
            out.append(
                {
                    "number": n,
                    "message": ans.get("reply_to"),
                    "id": str(msg.get("id") or ans.get("reply_to")),
                    "text": str(msg.get("text", "")),
                    "answer": str(ans.get("text", "")),
                }
            )
    return out
