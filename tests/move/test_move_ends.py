"""A move's two ends made ready at once: the destination's server is not started only
after a box was asked where the agent is (``lnk agent move --from BOX``, or an agent
looked for on every box).

The boxes are replaced here (a unit test of the order, through the real ``where_is``):
the moves that run them for real are in test_move_paths.py, test_one_copy.py and
test_refusals.py."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lnk.agents.layout import Machine
from lnk.errors import LnkError
from lnk.move import move as mv
from lnk.places import where as where_mod
from lnk.places.where import HERE, set_location


class Stop(Exception):
    pass


def _boxes(monkeypatch: pytest.MonkeyPatch, waits: bool) -> list[str]:
    """Replace the boxes: each end's start is recorded (and stops the move); a box asked
    where the agent is records it and, with ``waits``, answers only once the destination
    started (before this change it started only after that answer: the wait ran out)."""
    events: list[str] = []
    started = threading.Event()

    def ready_end(machine: Machine, place: str, say: Any, leg: Any = None) -> Any:
        events.append(f"start {place}")
        started.set()
        raise Stop(place)

    def on_box(machine: Machine, box: str, name: str) -> Any:
        events.append(f"ask {box}")
        if waits and started.wait(10):
            events.append("started meanwhile")
        raise Stop("where")

    one = SimpleNamespace(box="b1", agents=[SimpleNamespace(name="work")], error=None)
    monkeypatch.setattr(mv, "_ready_end", ready_end)
    monkeypatch.setattr(mv, "finish_all", lambda machine, say: [])
    monkeypatch.setattr(mv, "purge_expired", lambda machine: None)
    monkeypatch.setattr(where_mod, "_on_box", on_box)
    monkeypatch.setattr(where_mod, "agents_on_boxes", lambda: [one])
    return events


def test_the_destination_starts_while_the_box_it_leaves_is_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    events = _boxes(monkeypatch, waits=True)
    with pytest.raises(Stop, match="where"):
        mv.move(Machine(tmp_path), "work", "b2", from_box="b1")
    # b2's start began before b1 answered, and was waited for: nothing runs after the move
    assert sorted(events[:2]) == ["ask b1", "start b2"] and events[2:] == ["started meanwhile"]


def test_an_agent_asked_of_every_box_starts_the_destination_meanwhile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    events = _boxes(monkeypatch, waits=True)
    with pytest.raises(Stop, match="where"):
        mv.move(Machine(tmp_path), "work", "b2")  # neither here nor moved from here
    assert "started meanwhile" in events and events.count("start b2") == 1


def test_no_early_start_to_the_box_it_is_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    events = _boxes(monkeypatch, waits=False)
    with pytest.raises(Stop, match="where"):
        mv.move(Machine(tmp_path), "work", "b1", from_box="b1")
    assert events == ["ask b1"]  # (the move is refused: the agent is there already)


@pytest.mark.parametrize("known", [False, True], ids=["from here", "a place known here"])
def test_no_early_start_where_no_box_is_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, known: bool
) -> None:
    events = _boxes(monkeypatch, waits=False)
    machine = Machine(tmp_path)
    if known:  # this computer moved it to b1: where it is is known here, nothing asked
        set_location(machine, "work", "ag-1", "b1")
    # (no agent here, and no box b1 configured: where_is refuses; nothing started first)
    with pytest.raises(LnkError):
        mv.move(machine, "work", "b2", from_box=None if known else HERE)
    assert events == []
