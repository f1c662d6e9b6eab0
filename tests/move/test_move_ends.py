"""A move's two ends made ready at once: the destination's server is not started only
after a box was asked where the agent is (``lnk agent move --from BOX``).

The steps are replaced here (a unit test of the order): the moves that run them for
real are in test_move_paths.py, test_one_copy.py and test_refusals.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from lnk.agents.layout import Machine
from lnk.move import move as mv
from lnk.places.where import HERE, set_location


class Stop(Exception):
    pass


def _steps(monkeypatch: pytest.MonkeyPatch, asked: threading.Event | None) -> list[str]:
    """Replace the move's first steps: each end's start is recorded (and stops the
    move); where the agent is waits, with ``asked``, until the destination started."""
    started: list[str] = []
    dst_started = threading.Event()

    def ready_end(machine: Machine, place: str, say: Any, leg: Any = None) -> Any:
        started.append(place)
        dst_started.set()
        raise Stop(place)

    def where_is(machine: Machine, name: str | None, from_box: str | None = None) -> Any:
        # (before this change the destination started only after this answered)
        if asked is not None and dst_started.wait(10):
            asked.set()
        raise Stop("where")

    monkeypatch.setattr(mv, "_ready_end", ready_end)
    monkeypatch.setattr(mv, "where_is", where_is)
    monkeypatch.setattr(mv, "finish_all", lambda machine, say: [])
    monkeypatch.setattr(mv, "purge_expired", lambda machine: None)
    return started


def test_the_destination_starts_while_the_box_it_leaves_is_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = threading.Event()
    started = _steps(monkeypatch, asked)
    with pytest.raises(Stop, match="where"):
        mv.move(Machine(tmp_path), "work", "b2", from_box="b1")
    assert asked.is_set()  # the destination's start began before where_is answered
    assert started == ["b2"]  # and it was waited for: nothing runs after the move


@pytest.mark.parametrize(
    ("to", "from_box"),
    [("b1", "b1"), ("b1", HERE), ("b2", None)],
    ids=["to the box it is on", "from here", "a place known here"],
)
def test_no_early_start_where_nothing_is_asked_or_it_is_the_same_box(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, to: str, from_box: str | None
) -> None:
    started = _steps(monkeypatch, None)
    machine = Machine(tmp_path)
    if from_box is None:  # this computer moved it to b1: where it is is known here
        set_location(machine, "work", "ag-1", "b1")
    with pytest.raises(Stop, match="where"):
        mv.move(machine, "work", to, from_box=from_box)
    assert started == []


def test_an_agent_asked_of_every_box_starts_the_destination_meanwhile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = threading.Event()
    started = _steps(monkeypatch, asked)
    with pytest.raises(Stop, match="where"):
        mv.move(Machine(tmp_path), "work", "b2")  # neither here nor moved from here
    assert asked.is_set() and started == ["b2"]
    assert not mv._asks_a_box(Machine(tmp_path), "work", None, HERE)
