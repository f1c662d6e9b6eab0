"""The fence a bridge asks before every act: each thing that ends its time, one at a time."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.connections.fence import Fence, Gate, Stopped


@pytest.fixture
def fence(home: Path) -> Fence:
    a = registry.create(Machine(home), "main")
    a.runtime.mkdir(parents=True, exist_ok=True)
    (a.runtime / "key").write_bytes(b"k" * 32)
    return Fence(Machine(home), a.id, a.name, a.settings.epoch, b"k" * 32, 0)


def test_each_thing_that_ends_a_bridges_time(fence: Fence, home: Path) -> None:
    m, a = fence.machine, registry.find(Machine(home), "main")
    assert fence.why_not() is None
    (a.runtime / "key").write_bytes(b"n" * 32)  # started again: another start's key
    assert fence.why_not() == "the agent's start it belongs to is over"
    (a.runtime / "key").write_bytes(b"k" * 32)
    a.settings.epoch += 1  # a stream committed here since: the copy before is over
    a.save()
    assert "epoch here is 1, this bridge's 0" in (fence.why_not() or "")
    a.settings.epoch -= 1
    a.save()
    note = m.state_dir / "moved" / f"{a.id}.json"
    note.parent.mkdir(parents=True)
    note.write_text("{}")
    assert fence.why_not() == "the agent moved away from here"
    note.unlink()
    a.settings_path.unlink()
    assert fence.why_not() == "the agent's settings are gone from here"
    a.save()
    assert Fence(m, a.id, a.name, 0, b"k" * 32, 1).why_not() == "its runner is gone"


def test_a_gate_waits_while_held_and_stops_for_good(fence: Fence) -> None:
    gate = Gate(fence, poll_s=0.01)
    hold = fence.machine.hold_file(fence.agent_id)
    hold.write_text("held")
    child = gate.child()
    gate.stop.wait(0.05)
    waiter_done: list[str] = []

    def act() -> None:
        try:
            with child.acting():
                waiter_done.append("acted")
        except Stopped as e:
            waiter_done.append(f"stopped: {e}")

    t = threading.Thread(target=act)
    t.start()
    t.join(0.2)
    assert t.is_alive() and waiter_done == []  # held: it acts on nothing
    hold.unlink()
    t.join(5)
    assert waiter_done == ["acted"]
    gate.end("asked to stop")
    with pytest.raises(Stopped, match="asked to stop"), child.acting():
        pass
