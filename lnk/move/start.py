"""``lnk agent start``: finish what a move left, then start the agent here.

A start is where an unfinished move is finished (the design's "finished by the
next lnk agent move or lnk agent start"), and where the messages held for the
agent are handed over.  An agent that moved away, or lives on a box, is not
started here: the refusal says where it is.
"""

from __future__ import annotations

from collections.abc import Callable

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.moved import refuse_if_moved
from lnk.errors import LnkError, UsageError
from lnk.move import journal
from lnk.move.finish import finish_all
from lnk.move.held import deliver_all
from lnk.payload.receivers import purge_expired
from lnk.places.where import HERE, where_is
from lnk.protocol import Status
from lnk.runtime import service

Say = Callable[[str], None]


def finish_pending(machine: Machine, name: str | None, say: Say) -> None:
    """Finish the agent's unfinished moves (handing over what was held for it), and
    refuse an agent that is not here: one that moved away, or lives on a box."""
    if name is None and not journal.entries(machine):
        return
    try:
        where = where_is(machine, name, ask_boxes=False)
    except LnkError:
        if name is not None:
            refuse_if_moved(machine, name)
        raise
    finish_all(machine, say, where.id)
    if not machine.settings_file(where.name).exists():
        refuse_if_moved(machine, where.name)
        # the finished move took it elsewhere (or it was there already): say where
        place = where_is(machine, where.name, ask_boxes=False).place
        if place != HERE:
            raise UsageError(
                f"{where.name} is on the box {place}, not here",
                hint=f"lnk box run {place} -- agent start --agent {where.name}",
            )


def start_agent(machine: Machine, name: str | None, sandbox: bool | None, say: Say) -> Status:
    """Finish earlier moves, start the agent here, hand it the messages held for it."""
    purge_expired(machine)  # nothing secret lingers: old receivers, kept folders of moved agents
    finish_pending(machine, name, say)
    a = registry.find(machine, name)
    for note in service.prepare_start(a, sandbox):
        say(note)
    st = service.start(a)
    if not journal.entries(machine, a.id):  # else the lnk finishing its move hands them over
        deliver_all(machine, a.id, say)
    return st
