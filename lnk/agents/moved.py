"""The copy an agent leaves behind when it moves away.

Once the agent answers elsewhere, its settings, state and keys here are
deleted; its folders are kept aside in ``~/Link/Moved/<name>-<time>/`` for as
long as ``keep_moved`` in machine.toml says (30 days unless set; "never" keeps
them until you delete them).  A note, ``~/.lnk/moved/<id>.json``, says where it
went, and ``lnk agent start`` refuses its ID, saying where it is.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from lnk.agents.layout import Machine
from lnk.agents.machine import load_machine
from lnk.agents.registry import Agent
from lnk.errors import Refused

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
            return note
    return None


def refuse_if_moved(machine: Machine, name: str) -> None:
    note = note_for_name(machine, name)
    if note:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(note.get("at", 0)))
        raise Refused(f"{name} ({note.get('id')}) moved to {note.get('to')} on {when}; "
                      "it answers there, not here",
                      hint=f"move it back with: lnk agent move --here --agent {name}")


def leave(machine: Machine, agent: Agent, to: str) -> dict[str, Any]:
    """Delete what runs the agent here; keep its folders aside; leave a note."""
    from lnk.agents import service

    service.stop(agent)
    days = load_machine(machine).keep_moved_days()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kept = machine.home / "Link" / "Moved" / f"{agent.name}-{stamp}"
    if agent.folders.root.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        agent.folders.root.rename(kept)
        hashes = agent.runtime / "hashes.sqlite"
        if hashes.exists():  # so a move back hashes nothing it already knows
            hashes.rename(kept / ".lnk-hashes.sqlite")
    now = time.time()
    note = {"id": agent.id, "name": agent.name, "to": to, "at": now, "kept": str(kept),
            "until": None if days is None else now + days * DAY}
    d = notes_dir(machine)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{agent.id}.json").write_text(json.dumps(note, indent=1))
    shutil.rmtree(agent.runtime, ignore_errors=True)
    shutil.rmtree(agent.net, ignore_errors=True)
    agent.settings_path.unlink(missing_ok=True)
    return note


def purge_expired(machine: Machine, now: float | None = None) -> list[str]:
    """Delete moved agents' kept folders whose time is up."""
    now = time.time() if now is None else now
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
            shutil.rmtree(kept, ignore_errors=True)
            gone.append(kept)
    return gone
