"""``lnk agent start``: finish what a move left, then start the agent here.

A start is where an unfinished move is finished (the design's "finished by the
next lnk agent move or lnk agent start"), and where the messages held for the
agent are handed over.  An agent that moved away, or lives on a box, is not
started here: the refusal says where it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.moved import refuse_if_moved
from lnk.errors import LnkError, UsageError
from lnk.move import journal
from lnk.move.held import deliver_all
from lnk.move.move import finish_all
from lnk.move.where import HERE, where_is
from lnk.payload.receivers import purge_expired
from lnk.runtime import service

Say = Callable[[str], None]


def finish_pending(machine: Machine, name: str | None, say: Say) -> None:
    """Finish the agent's unfinished moves (handing over what was held for it), and
    refuse an agent that is not here: one that moved away, or lives on a box."""
    if name is None and not journal.entries(machine):
        return
    try:
        name, agent_id, _ = where_is(machine, name, ask_boxes=False)
    except LnkError:
        if name is not None:
            refuse_if_moved(machine, name)
        raise
    finish_all(machine, say, agent_id)
    if not machine.settings_file(name).exists():
        refuse_if_moved(machine, name)
        _, _, place = where_is(machine, name, ask_boxes=False)
        if place != HERE:
            raise UsageError(
                f"{name} is on the box {place}, not here",
                hint=f"lnk box run {place} -- lnk agent start --agent {name}",
            )


def start_agent(
    machine: Machine, name: str | None, sandbox: bool | None, say: Say
) -> dict[str, Any]:
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
