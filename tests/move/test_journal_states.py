"""The move journal is a state machine: one step forward at a time, nothing else."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from lnk.agents.layout import Machine
from lnk.errors import Refused
from lnk.move import journal
from lnk.move.journal import PHASES, check_step


def _entry(home: Path) -> journal.Entry:
    return journal.new_entry(Machine(home), agent="a", agent_id="ag-x", src="here", dst="b")


def test_the_happy_path_walks_every_phase_once(home: Path) -> None:
    e = _entry(home)
    for phase in PHASES[1:]:
        e.set(phase=phase)
        assert json.loads(e.path.read_text())["phase"] == phase  # type: ignore[union-attr]
    e.remove()


# the move's arrows as docs/architecture.md draws them, written here on their own (not read
# from the table under test): one step forward, and a start retried once answering
ALLOWED = {
    ("started", "prepared"),
    ("prepared", "bulk-sent"),
    ("bulk-sent", "paused"),
    ("paused", "committed"),
    ("committed", "answering"),
    ("answering", "answering"),
    ("answering", "cleaned"),
}
EVERY = ("started", "prepared", "bulk-sent", "paused", "committed", "answering", "cleaned")


def test_the_phases_are_the_drawn_ones() -> None:
    assert PHASES == EVERY


@pytest.mark.parametrize("old,new", list(itertools.product(EVERY, EVERY)))
def test_only_the_drawn_arrows_are_allowed(old: str, new: str) -> None:
    if (old, new) in ALLOWED:
        check_step(old, new)
    else:
        with pytest.raises(Refused, match=f"from {old} to {new}"):
            check_step(old, new)


def test_a_misspelt_field_is_an_error_not_dropped(home: Path) -> None:
    e = _entry(home)
    with pytest.raises(TypeError):
        e.set(phse="prepared")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        e.set(recevier="rcv-x")  # type: ignore[call-arg]
    assert json.loads(e.path.read_text())["phase"] == "started"  # type: ignore[union-attr]


def test_an_entry_from_a_newer_lnk_is_still_loaded(home: Path) -> None:
    e = _entry(home)
    assert e.path is not None
    data = json.loads(e.path.read_text()) | {"a_field_of_tomorrow": 1}
    e.path.write_text(json.dumps(data))
    assert [x.move for x in journal.entries(Machine(home))] == [e.move]


def test_backwards_and_sideways_are_refused_and_not_written(home: Path) -> None:
    e = _entry(home)
    e.set(phase="prepared")
    e.set(phase="bulk-sent")
    for bad in ("prepared", "started", "committed", "cleaned", "nonsense"):
        with pytest.raises(Refused):
            e.set(phase=bad)
    assert json.loads(e.path.read_text())["phase"] == "bulk-sent"  # type: ignore[union-attr]


def test_a_failed_move_only_goes_on_once_committed(home: Path) -> None:
    e = _entry(home)
    e.set(phase="prepared")
    e.set(failed="the box went away")
    with pytest.raises(Refused):
        e.set(phase="bulk-sent")
    with pytest.raises(Refused):
        e.set(failed=None)
    f = _entry(home)
    for phase in ("prepared", "bulk-sent", "paused", "committed"):
        f.set(phase=phase)
    f.set(failed="the mover was killed")
    f.set(failed=None)  # committed: the only way left is forward
    f.set(phase="answering")


def test_an_entry_with_an_unknown_phase_is_not_loaded(home: Path) -> None:
    e = _entry(home)
    assert e.path is not None
    data = json.loads(e.path.read_text())
    data["phase"] = "teleported"
    e.path.write_text(json.dumps(data))
    assert journal.entries(Machine(home)) == []


def test_a_move_that_fails_beside_its_prepare_notes_the_receiver_made(home: Path) -> None:
    """The prepare runs beside the source's questions: when the move fails before it took
    the prepare's answer, the receiver made (and only one made) goes in the entry, so
    it is abandoned with the rest."""
    from concurrent.futures import Future

    from lnk.move.move import _note_receiver
    from lnk.protocol import Prepared

    made = Prepared("rcv-0123456789abcdef", "lnkpk1...", 4, 12, True)
    done: Future[Prepared] = Future()
    done.set_result(made)
    failed: Future[Prepared] = Future()
    failed.set_exception(OSError("the box went away"))
    cancelled: Future[Prepared] = Future()
    cancelled.cancel()
    running: Future[Prepared] = Future()
    cases = [
        (None, None),
        (running, None),
        (cancelled, None),
        (failed, None),
        (done, made.receiver),
    ]
    for preparing, noted in cases:
        e = _entry(home)
        _note_receiver(e, preparing)
        assert json.loads(e.path.read_text())["receiver"] == noted  # type: ignore[union-attr]
        e.remove()
