"""The move journal on the computer running a move: ``~/.lnk/journal/<move>.json``.

One entry a move.  It says where the move stands (its phase), so a move that
can't be ended at once (the mover killed, a box that stopped answering) is
finished by the next ``lnk agent move`` or ``lnk agent start`` of that agent.
An entry for a box that doesn't answer stays until it does.

Where each agent is (when it is not on this computer) is kept beside it, in
``~/.lnk/locations.json``: agent name -> {"id", "place"}.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lnk.agents.layout import Machine

PHASES = ("started", "prepared", "bulk-sent", "paused", "committed", "answering", "cleaned")


@dataclass
class Entry:
    move: str
    agent: str
    agent_id: str
    src: str  # "here" or a box name
    dst: str
    no_start: bool = False
    phase: str = "started"
    receiver: str | None = None
    was_running: bool = True
    dst_had_agent: bool = False
    failed: str | None = None  # why the move is being undone
    started_at: float = field(default_factory=time.time)
    path: Path | None = None

    def save(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = asdict(self)
        data.pop("path")
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    def set(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)
        self.save()

    def remove(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            _unlock(self.path)

    def at_least(self, phase: str) -> bool:
        return PHASES.index(self.phase) >= PHASES.index(phase)


_held_locks: dict[str, int] = {}


def _lock(path: Path) -> bool:
    """Hold the entry's lock for this process: a live move holds its own entry's."""
    if str(path) in _held_locks:
        return True
    lock = path.with_suffix(".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held_locks[str(path)] = fd
    return True


def _unlock(path: Path) -> None:
    fd = _held_locks.pop(str(path), None)
    if fd is not None:
        path.with_suffix(".lock").unlink(missing_ok=True)
        os.close(fd)


def new_entry(machine: Machine, **kw: Any) -> Entry:
    move = "mv-" + time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(3)
    e = Entry(move=move, **kw)
    e.path = machine.journal_dir / f"{move}.json"
    e.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _lock(e.path)
    e.save()
    return e


def unfinished(machine: Machine, agent_id: str | None = None) -> list[Entry]:
    """Entries no running move holds: the ones a later move or start must finish."""
    return [e for e in entries(machine, agent_id) if e.path is not None and _lock(e.path)]


def entries(machine: Machine, agent_id: str | None = None) -> list[Entry]:
    out: list[Entry] = []
    if not machine.journal_dir.is_dir():
        return out
    for p in sorted(machine.journal_dir.glob("mv-*.json")):
        try:
            data = json.loads(p.read_text())
            e = Entry(**data)
        except (OSError, ValueError, TypeError):
            continue
        e.path = p
        if agent_id is None or e.agent_id == agent_id:
            out.append(e)
    return out


def _locations_path(machine: Machine) -> Path:
    return machine.state_dir / "locations.json"


def locations(machine: Machine) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(_locations_path(machine).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def set_location(machine: Machine, name: str, agent_id: str, place: str) -> None:
    locs = locations(machine)
    if place == "here":
        locs.pop(name, None)
    else:
        locs[name] = {"id": agent_id, "place": place}
    p = _locations_path(machine)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(locs, indent=1))
    os.replace(tmp, p)
