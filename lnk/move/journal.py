"""The move journal on the computer running a move: ``~/.lnk/journal/<move>.json``.

One entry a move.  It says where the move stands (its phase), so a move that
can't be ended at once (the mover killed, a box that stopped answering) is
finished by the next ``lnk agent move`` or ``lnk agent start`` of that agent.
An entry for a box that doesn't answer stays until it does.

Where each agent is (when it is not on this computer) is kept by
:mod:`lnk.places.where` (``~/.lnk/locations.json``).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lnk.agents.layout import Machine
from lnk.errors import Refused

PHASES = ("started", "prepared", "bulk-sent", "paused", "committed", "answering", "cleaned")

TRANSITIONS: dict[str, frozenset[str]] = {
    "started": frozenset({"prepared"}),  # a receiver is ready at the destination
    "prepared": frozenset({"bulk-sent"}),  # the bulk went while the agent answered
    "bulk-sent": frozenset({"paused"}),  # the agent is paused where it was
    "paused": frozenset({"committed"}),  # the final stream committed at the destination
    "committed": frozenset({"answering"}),  # the agent answers at the destination
    "answering": frozenset({"answering", "cleaned"}),  # a retried start answers again
    "cleaned": frozenset(),  # the source let go of it: the entry is removed
}
"""The move's phases, each with the phases it may go to: only ever one step forward.

Apart from its phase, an entry may be *failed* (being undone) in any phase
before ``cleaned``; only a move that committed may drop ``failed`` again,
because then the only way left is forward (docs/architecture.md draws it).
"""


class _Keep:
    """``Entry.set(failed=...)`` left out: the entry's failure stays as it is."""


KEEP = _Keep()


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
    final: str | None = None  # the final stream's ID, as the destination committed it
    started_at: float = field(default_factory=time.time)
    path: Path | None = None

    def __post_init__(self) -> None:
        if self.phase not in TRANSITIONS:
            raise ValueError(f"unknown move phase {self.phase!r}")

    def save(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = asdict(self)
        data.pop("path")
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    def set(
        self,
        *,
        phase: str | None = None,
        receiver: str | None = None,
        dst_had_agent: bool | None = None,
        was_running: bool | None = None,
        failed: str | _Keep | None = KEEP,
        final: str | None = None,
    ) -> None:
        """Change the entry and write it: its phase (a step the state machine has no arrow
        for, backwards, sideways or out of a failed move, is refused), the receiver and
        what the destination held (learnt at the prepare), or why it failed (None: it
        goes on), whether the agent ran at the source (as its status answered, beside
        the prepare), and the final stream's ID (at the commit).  Only these change; a
        misspelt one is a TypeError, caught by mypy."""
        if phase is not None:
            check_step(self.phase, phase, self.failed is not None)
        if failed is None and self.failed is not None and not self.at_least("committed"):
            raise Refused(
                f"move {self.move}: a failed move can go on only once it committed "
                f"(it is {self.phase})"
            )
        if isinstance(failed, str) and self.phase == "cleaned":
            raise Refused(f"move {self.move} is cleaned; it can no longer fail")
        if phase is not None:
            self.phase = phase
        if receiver is not None:
            self.receiver = receiver
        if dst_had_agent is not None:
            self.dst_had_agent = dst_had_agent
        if was_running is not None:
            self.was_running = was_running
        if not isinstance(failed, _Keep):
            self.failed = failed
        if final is not None:
            self.final = final
        self.save()

    def remove(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            _unlock(self.path)

    def at_least(self, phase: str) -> bool:
        return PHASES.index(self.phase) >= PHASES.index(phase)


_FIELDS = {f.name for f in fields(Entry)} - {"path"}


def check_step(old: str, new: str, failed: bool = False) -> None:
    """Refuse a phase change that is not an arrow of :data:`TRANSITIONS`."""
    if new not in TRANSITIONS:
        raise Refused(f"unknown move phase {new!r}")
    if new not in TRANSITIONS[old]:
        raise Refused(f"a move cannot go from {old} to {new}")
    if failed and new != "committed" and PHASES.index(new) < PHASES.index("committed"):
        raise Refused(f"a failed move cannot go on to {new}: it is being undone")


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
            e = Entry(**{k: v for k, v in data.items() if k in _FIELDS})
        except (OSError, ValueError, TypeError):
            continue
        e.path = p
        if agent_id is None or e.agent_id == agent_id:
            out.append(e)
    return out
