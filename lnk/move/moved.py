"""A move's steps at its ends: pause the agent, leave for good, and at the destination let
its connections go on once the copy where it was is gone.

Leaving: the agent stops here, its folders are kept aside, a note says where it went.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import time
from typing import Any

from lnk.agents import registry, secrets
from lnk.agents.layout import Machine
from lnk.agents.machine import load_machine
from lnk.agents.moved import DAY, notes_dir, purge_expired
from lnk.agents.policy import remember
from lnk.agents.registry import Agent
from lnk.backup import timers
from lnk.errors import InvalidInput, NotFound, UsageError
from lnk.fsutil import rmtree
from lnk.payload.kept import adopt_sent, record_left
from lnk.protocol import BackupSchedule, Left
from lnk.runtime import service

STREAM_ID = re.compile("[0-9a-f]{32}")


def leave(machine: Machine, agent: Agent, to: str, final: str | None = None) -> dict[str, Any]:
    """Delete what runs the agent here (its keys and its backup timer too); keep its folders
    aside; leave a note.  ``final``: the move's final stream, as the destination committed
    it (its send noted how the agent left: then nothing is walked here)."""
    schedule = timers.read_schedule(machine, agent.id)
    service.stop(agent)
    remember(machine, agent.settings, agent.folders.sandbox_toml)  # for its return
    days = load_machine(machine).keep_moved_days()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kept = machine.home / "Link" / "Moved" / f"{agent.name}-{stamp}"
    if agent.folders.root.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        agent.folders.root.rename(kept)
        hashes = agent.runtime / "hashes.sqlite"
        if hashes.exists():  # so a move back hashes nothing it already knows
            hashes.rename(kept / ".lnk-hashes.sqlite")
        # and tells what a person changed here meanwhile by its stat alone
        cache = kept / ".lnk-hashes.sqlite"
        # (best effort: without the note a move back tells changes by the cache alone;
        # a name a person gave a file there meanwhile that is not UTF-8 stops no leaving)
        with contextlib.suppress(OSError, sqlite3.Error, InvalidInput):
            if not (final and cache.exists() and adopt_sent(cache, final)):
                record_left(kept, cache)
    now = time.time()
    note = {
        "id": agent.id,
        "name": agent.name,
        "to": to,
        "at": now,
        "kept": str(kept),
        "until": None if days is None else now + days * DAY,
        "schedule": schedule,
    }
    d = notes_dir(machine)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{agent.id}.json").write_text(json.dumps(note, indent=1))
    rmtree(agent.runtime)
    rmtree(agent.net)
    secrets.remove_all(machine, agent.id)  # carried where it went before the bulk
    if schedule is not None:
        timers.uninstall(machine, agent.id)  # its schedule follows it: the move says so
    agent.settings_path.unlink(missing_ok=True)
    return note


def pause(machine: Machine, name: str | None) -> bool:
    """(``agent pause``) Stop the agent for the switch; its running turn ends first."""
    return service.stop(registry.find(machine, name))


def moved_away(
    machine: Machine, name: str | None, agent_id: str, to: str, final: str | None = None
) -> Left:
    """(``agent moved-away``) The agent answers at ``to``: leave, and purge expired kept folders.
    ``final``: the stream ID of the move's final, as the destination committed it.

    An empty answer when it has left already (a journal finishing a move runs this again).
    """
    if final is not None and not STREAM_ID.fullmatch(final):
        raise UsageError(f"--final {final!r} is not a stream ID", hint="32 hex digits")
    try:
        a = registry.find(machine, name)
    except NotFound:
        return Left()
    if a.id != agent_id:
        raise UsageError(f"{a.name} here is {a.id}, not {agent_id}", hint="nothing was removed")
    note = leave(machine, a, to, final)
    purge_expired(machine)
    sched = note.get("schedule")
    return Left(
        kept=str(note["kept"]),
        schedule=BackupSchedule.from_json(sched) if isinstance(sched, dict) else None,
    )


def moved_in(machine: Machine, name: str | None, agent_id: str) -> bool:
    """(``agent moved-in``) The copy where the agent was is gone: its connections and
    schedules here go on (the hold its move's final wrote goes).  True if one was held."""
    a = registry.find(machine, name)
    if a.id != agent_id:
        raise UsageError(f"{a.name} here is {a.id}, not {agent_id}", hint="nothing was changed")
    hold = machine.hold_file(a.id)
    if not hold.exists():
        return False
    hold.unlink()
    return True
