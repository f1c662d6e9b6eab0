"""One turn a conversation: leases, crashed turns, racing appends."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from lnk.agents.stores import store_path
from lnk.collections import CollectionId, open_store
from lnk.collections.base import Store, now_ms
from lnk.harness import client
from lnk.harness.model import OfflineModel
from lnk.harness.turns import NOT_MADE, Busy, Conversations, append_event

CID = CollectionId("events", "link:main")


def _prewrite_crash(store: Store) -> None:
    assert store.append(CID, 1, {"type": "message", "from": "owner", "text": "do x"})
    assert store.append(
        CID, 2, {"type": "tool_call", "call_id": "c1", "tool": "shell", "args": {"cmd": "x"}}
    )
    assert store.append(CID, 3, {"type": "tool_call", "call_id": "c2", "tool": "read", "args": {}})
    assert store.append(
        CID, 4, {"type": "tool_result", "call_id": "c2", "made": True, "text": "ok"}
    )
    long_ago = now_ms() - 10 * store.lapse_ms
    assert store.take_lease(CID, "harness-dead", now_ms=long_ago) is not None


@pytest.mark.parametrize("driver", ["files", "sqlite"])
def test_crashed_turn_is_finished_before_the_new_message(start_agent: Any, driver: str) -> None:
    r_agent = None
    from lnk.agents import registry
    from lnk.agents.layout import Machine

    r_agent = registry.create(Machine.current(), "main", store=driver)
    r_agent.settings.sandbox = False
    r_agent.save()
    path = store_path(r_agent.folders.chats, driver)
    with open_store(driver, path, lapse_ms=r_agent.settings.lapse_s * 1000) as store:
        _prewrite_crash(store)
    r = start_agent(agent=r_agent)
    answer = client.send_message(r.port, r.key, "link:main", "hello", timeout=30)
    assert answer == "[main] you said: hello (message 2 in link:main)"
    with open_store(driver, path) as store:
        evs = [(e.number, e.data) for e in store.read(CID)]
        assert store.read_lease(CID) is None  # released after the turn
    assert [d["type"] for _, d in evs] == [
        "message",
        "tool_call",
        "tool_call",
        "tool_result",
        "tool_result",
        "answer",
        "unclaimed",  # its caller went with the crash: the next chat takes it
        "message",
        "answer",
    ]
    n5, not_made = evs[4]
    assert n5 == 5 and not_made["call_id"] == "c1" and not_made["made"] is False
    assert not_made["text"] == NOT_MADE
    recovered = evs[5][1]
    assert recovered["recovered"] is True and recovered["reply_to"] == 1
    assert "do x" in recovered["text"]
    assert evs[6][1] == {"type": "unclaimed", "answer": 6}
    assert evs[7][1]["text"] == "hello" and evs[8][1]["text"] == answer
    kept = client.claim_unclaimed(r.port, r.key, "link:main")
    assert [(k["text"], k["number"]) for k in kept] == [("do x", 6)]
    assert client.claim_unclaimed(r.port, r.key, "link:main") == []  # handed over once


def _convs(tmp_path: Path, lapse_ms: int = 60_000, **kw: Any) -> Conversations:
    store = open_store("files", tmp_path / "chats", lapse_ms=lapse_ms)
    return Conversations(store, "unit", OfflineModel(), renew_s=10, **kw)


def test_a_turn_that_answered_everything_only_lets_go(tmp_path: Path) -> None:
    c = _convs(tmp_path)
    c.handle("link:main", "one")
    long_ago = now_ms() - 10 * c.store.lapse_ms
    assert c.store.take_lease(CID, "harness-dead", now_ms=long_ago) is not None
    c.handle("link:main", "two")
    kinds = [e.data["type"] for e in c.store.read(CID)]
    assert kinds == ["message", "answer", "message", "answer"]


def test_a_live_turn_elsewhere_makes_a_message_wait_then_busy(tmp_path: Path) -> None:
    c = _convs(tmp_path, wait_s=0.3)
    assert c.store.take_lease(CID, "harness-other") is not None
    with pytest.raises(Busy):
        c.handle("link:main", "hello")
    assert c.store.read(CID) == []
    c.store.release_lease(CID, "harness-other")
    assert c.handle("link:main", "hello")["message"] == 1


def test_concurrent_messages_take_turns(tmp_path: Path) -> None:
    c = _convs(tmp_path)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        out = c.handle("link:main", f"m{i}")
        with lock:
            results.append(out)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    evs = c.store.read(CID)
    assert [e.number for e in evs] == list(range(1, 17))
    for i in range(0, 16, 2):  # each answer right after its own message
        assert evs[i].data["type"] == "message" and evs[i + 1].data["type"] == "answer"
        assert evs[i + 1].data["reply_to"] == evs[i].number
    assert sorted(r["message"] for r in results) == list(range(1, 17, 2))


def test_append_event_reads_again_after_losing(tmp_path: Path) -> None:
    store = open_store("files", tmp_path / "s")
    real_last = store.last_number
    calls = {"n": 0}

    def stale_last(cid: CollectionId) -> int:  # the first read is stale: the append loses
        calls["n"] += 1
        return 0 if calls["n"] == 1 else real_last(cid)

    assert store.append(CID, 1, {"type": "message", "text": "first"})
    store.last_number = stale_last  # type: ignore[method-assign]
    assert append_event(store, CID, {"type": "message", "text": "second"}) == 2
    assert calls["n"] == 2


class _SlowModel:
    """Answers only when the test lets it, so a turn stays open."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def answer(self, turn: Any) -> str:
        assert self.go.wait(60)
        return "done"


def test_the_lease_is_renewed_while_a_turn_runs(tmp_path: Path) -> None:
    import time

    store = open_store("files", tmp_path / "chats", lapse_ms=60_000)
    model = _SlowModel()
    c = Conversations(store, "unit", model, renew_s=0.05)
    t = threading.Thread(target=c.handle, args=("link:main", "slow"))
    t.start()
    try:
        deadline = time.monotonic() + 30
        first = None
        while time.monotonic() < deadline:
            lease = store.read_lease(CID)
            if lease is not None and first is None:
                first = lease.renewed_ms
            if lease is not None and first is not None and lease.renewed_ms > first:
                break
            time.sleep(0.01)
        lease = store.read_lease(CID)
        assert lease is not None and lease.holder == c.holder
        assert first is not None and lease.renewed_ms > first
        assert store.take_lease(CID, "harness-other") is None  # the turn is held
    finally:
        model.go.set()
        t.join(timeout=60)
    assert store.read_lease(CID) is None
    assert [e.data["text"] for e in store.read(CID)] == ["slow", "done"]
