"""Ending a move: forward (the agent answers where it went) or back (undone).

A move's own run ends it here, and so does the next ``lnk agent move`` or
``lnk agent start`` of the agent, for a move that couldn't be ended at once
(its journal entry).  Either way the two legs are resolved once for the
entry and passed down.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lnk.agents.layout import Machine
from lnk.errors import LnkError, TransportError
from lnk.move import journal, ready, steps
from lnk.move.faults import fault
from lnk.move.held import deliver_all
from lnk.move.journal import Entry
from lnk.move.steps import Ends
from lnk.places.where import place_leg, set_location
from lnk.protocol import Left, Status

Say = Callable[[str], None]


def ends_of(machine: Machine, e: Entry) -> Ends:
    """The legs of a journal entry's two places."""
    return Ends(place_leg(machine, e.src), place_leg(machine, e.dst))


def forward(
    machine: Machine,
    e: Entry,
    ends: Ends,
    say: Say,
    answered: Callable[[], None] = lambda: None,
    left: Callable[[Left], None] = lambda _left: None,
) -> Status | None:
    """The agent starts where it went; once it answers there, the copy where it was goes
    (``left`` hears what it did)."""
    status = None
    if not e.no_start:
        status = steps.start_there(ends.dst, e.agent)
        if not status.running or status.id != e.agent_id:
            raise TransportError(
                f"{e.agent} does not answer on {ends.dst.name} after the move",
                hint=f"lnk agent logs --agent {e.agent}"
                if e.dst == "here"
                else f"lnk box run {e.dst} -- agent logs --agent {e.agent}",
            )
    elif not steps.holds(ends.dst, e):
        raise TransportError(
            f"{e.agent} is not on {ends.dst.name} after the move",
            hint="the copy where it was stays; move it again",
        )
    answered()
    e.set(phase="answering")
    fault("move:after-start")
    gone = steps.let_go(ends.src, e, ends.dst.name)
    steps.moved_in(ends.dst, e)  # only now its bridge there polls and fires
    e.set(phase="cleaned")
    left(gone)
    set_location(machine, e.agent, e.agent_id, e.dst)
    e.remove()
    say(f"{e.agent} moved to {ends.dst.name}" + ("" if e.no_start else " and answers there"))
    return status


def undo(machine: Machine, e: Entry, ends: Ends, say: Say) -> None:
    """Put the agent back where it was; keep the entry if a box doesn't answer."""
    stale: LnkError | None = None
    try:
        if e.at_least("committed") and not steps.holds(ends.src, e):
            # the copy where it was is gone already: the only way left is forward
            say(f"{e.agent} is no longer on {ends.src.name}; finishing the move instead")
            e.set(failed=None)
            forward(machine, e, ends, say)
            return
        if e.at_least("paused") and not e.dst_had_agent:
            # a final stream that got through before its leg failed committed there too
            stale = steps.remove_copy(ends.dst, e)
        steps.abandon(ends.dst, e)
        if stale is None:
            ready.forget_there(ends, e)  # the keys carried for it there go too
        if e.was_running:  # one stopped before the move stays stopped
            ends.src.run(["agent", "start", "--agent", e.agent])
    except LnkError as err:
        stale = err
    if stale is not None:
        say(
            f"could not finish undoing the move yet ({stale}); it stays in the journal and "
            "the next lnk agent move or start of it finishes it"
        )
        return
    e.remove()


def finish(machine: Machine, e: Entry, say: Say) -> bool:
    """Finish one journal entry: forward if the destination holds the agent, else back."""
    try:
        ends = ends_of(machine, e)
        if e.failed:
            undo(machine, e, ends, say)
        elif e.at_least("committed"):
            forward(machine, e, ends, say)
        elif e.at_least("paused"):
            try:
                has = steps.holds(ends.dst, e)
            except TransportError:
                has = False  # not seen there: undone, and the agent answers where it was
            if has and not e.dst_had_agent:
                e.set(phase="committed")
                forward(machine, e, ends, say)
            else:
                e.set(failed="the move was stopped midway")
                undo(machine, e, ends, say)
        else:
            steps.abandon(ends.dst, e)
            e.remove()
    except LnkError as err:
        say(f"the unfinished move {e.move} of {e.agent} could not be finished yet: {err}")
        return False
    return not (e.path and e.path.exists())


def finish_all(machine: Machine, say: Say, agent_id: str | None = None) -> list[str]:
    """Finish the unfinished moves (of one agent, or all); hand over what was held for them.

    Returns the IDs of the agents whose moves are finished now.
    """
    done: list[str] = []
    for e in _unfinished(machine, agent_id):
        say(f"finishing the earlier move {e.move} of {e.agent}")
        if finish(machine, e, say) and e.agent_id not in done:
            done.append(e.agent_id)
    for aid in done:
        if not journal.entries(machine, aid):
            deliver_all(machine, aid, say)
    return done


def _unfinished(machine: Machine, agent_id: str | None) -> list[Entry]:
    """The entries no live move holds.  A chat that just looked at an entry's lock
    (:func:`lnk.move.held.mover_alive`) holds it for an instant: look again then."""
    for _ in range(5):
        found = journal.unfinished(machine, agent_id)
        if found or not journal.entries(machine, agent_id):
            return found
        time.sleep(0.05)
    return []
