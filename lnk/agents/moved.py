"""The copy an agent leaves behind when it moves away.

Once the agent answers elsewhere, its settings, state and keys here are
deleted; its folders are kept aside in ``~/Link/Moved/<name>-<time>/`` for as
long as ``keep_moved`` in machine.toml says (30 days unless set; "never" keeps
them until you delete them).  A note, ``~/.lnk/moved/<id>.json``, says where it
went, and ``lnk agent start`` refuses its ID, saying where it is.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lnk.agents.layout import Machine
from lnk.agents.machine import now as clock
from lnk.errors import Refused
from lnk.fsutil import rmtree

DAY = 86400.0


def notes_dir(machine: Machine) -> Path:
    return machine.state_dir / "moved"


def note_for_name(machine: Machine, name: str) -> dict[str, Any] | None:
    d = notes_dir(machine)
    if not d.is_dir():
        return None
    for p in d.glob("*.json"):
        try:
            note = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if note.get("name") == name:
            return dict(note)
    return None


def refuse_if_moved(machine: Machine, name: str) -> None:
    note = note_for_name(machine, name)
    if note:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(note.get("at", 0)))
        raise Refused(
            f"{name} ({note.get('id')}) moved to {note.get('to')} on {when}; "
            "it answers there, not here",
            hint=f"move it back with: lnk agent move --here --agent {name}",
        )


def lives_elsewhere(machine: Machine, agent_id: str) -> str | None:
    """Where this machine knows the agent with this ID lives, when it is not here.

    Its note, if it moved away from here; else ``~/.lnk/locations.json``, if this
    computer moved it to a box.  None when this machine knows of no other place.
    """
    try:
        note = json.loads((notes_dir(machine) / f"{agent_id}.json").read_text())
    except (OSError, ValueError):
        note = None
    if isinstance(note, dict):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(note.get("at", 0)))
        return f"it moved to {note.get('to')} on {when}"
    try:
        locs = json.loads((machine.state_dir / "locations.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(locs, dict):
        for loc in locs.values():
            if isinstance(loc, dict) and loc.get("id") == agent_id:
                return f"it lives on box {loc.get('place')}, moved there from here"
    return None


def purge_expired(machine: Machine, now: float | None = None) -> list[str]:
    """Delete moved agents' kept folders whose time is up."""
    now = clock() if now is None else now
    gone: list[str] = []
    d = notes_dir(machine)
    if not d.is_dir():
        return gone
    for p in d.glob("*.json"):
        try:
            note = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        until, kept = note.get("until"), note.get("kept")
        if until is not None and now >= until and kept and Path(kept).exists():
            rmtree(kept)
            gone.append(kept)
    return gone
