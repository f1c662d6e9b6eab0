"""Where an agent is: here, on the box it was moved to, or on any added box.

This computer knows the agents it holds, the ones it moved to a box
(``~/.lnk/locations.json``), and it can ask every added box for its own
agents (``lnk agent list --here --json`` there), which finds an agent created
or restored on a box.  A box that does not answer is named, never skipped in
silence.

:func:`where_is` resolves an agent's place once, as a :class:`Whereabouts`
(its name, ID, place and the leg that reaches it), which callers pass on
rather than resolving it again.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from lnk.agents import registry
from lnk.agents.bots import public
from lnk.agents.layout import Machine
from lnk.errors import LnkError, NotFound, UsageError
from lnk.places import boxes
from lnk.places.boxes import Box
from lnk.protocol import AgentList, AgentRow, ProtocolError, Status, Unanswered, decode
from lnk.runtime import service
from lnk.transport.legs import Leg, LocalLeg

HERE = "here"
Say = Callable[[str], None]


@dataclass(frozen=True)
class Whereabouts:
    """An agent's place, resolved once: its name and ID, where it is, the leg to it."""

    name: str
    id: str
    place: str  # HERE or a box's name
    leg: Leg

    @property
    def here(self) -> bool:
        return self.place == HERE


def place_leg(machine: Machine, place: str) -> Leg:
    if place == HERE:
        return LocalLeg(machine.home, name="this computer")
    return boxes.get(place).leg()


# --- locations: which box each agent moved to ------------------------------------


def _locations_path(machine: Machine) -> Path:
    return machine.state_dir / "locations.json"


def locations(machine: Machine) -> dict[str, dict[str, str]]:
    """Agent name -> {"id", "place"} of the agents this computer moved to a box."""
    try:
        data = json.loads(_locations_path(machine).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def set_location(machine: Machine, name: str, agent_id: str, place: str) -> None:
    locs = locations(machine)
    if place == HERE:
        locs.pop(name, None)
    else:
        locs[name] = {"id": agent_id, "place": place}
    p = _locations_path(machine)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(locs, indent=1))
    os.replace(tmp, p)


# --- where_is ------------------------------------------------------------------


def _on_box(machine: Machine, box: str, name: str) -> Whereabouts:
    leg = place_leg(machine, box)
    st = leg.ask(["agent", "status", "--agent", name, "--json"], Status)
    if st.place != HERE:  # its lnk asked another place: not on that box itself
        raise NotFound(
            f"{name} is not on box {box} itself (it is on {st.place} from there)",
            hint=f"name the box it is on: --from {st.place}",
        )
    return Whereabouts(name, st.id, box, leg)


def where_is(
    machine: Machine,
    name: str | None,
    from_box: str | None = None,
    *,
    ask_boxes: bool = True,
    asking: Callable[[], object] | None = None,
) -> Whereabouts:
    """Where the agent is: here, where this computer moved it, or on a box.

    ``from_box`` names the box it is on (one created or restored there); without
    it, an agent neither here nor moved from here is looked for on every box
    (unless ``ask_boxes`` is False).  ``asking()`` is called once just before a box is
    asked (a caller may start meanwhile what it needs next), never when none is.
    """
    if from_box is not None and from_box != HERE:
        if name is None:
            raise UsageError(f"say which agent on {from_box}", hint="add --agent NAME")
        if asking is not None:
            asking()
        return _on_box(machine, from_box, name)
    locs = locations(machine)
    if name is None:
        known = set(registry.names(machine)) | set(locs)
        if len(known) != 1:
            raise UsageError(
                "say which agent" if known else "there is no agent here",
                hint="add --agent NAME" if known else "lnk agent create NAME",
            )
        name = known.pop()
    if machine.settings_file(name).exists():
        a = registry.find(machine, name)
        return Whereabouts(name, a.id, HERE, place_leg(machine, HERE))
    if from_box == HERE:
        raise NotFound(f"no agent named {name!r} on this computer", hint="lnk agent list")
    if name in locs:
        place = locs[name]["place"]
        return Whereabouts(name, locs[name]["id"], place, place_leg(machine, place))
    if not ask_boxes:
        raise NotFound(
            f"no agent named {name!r} here or on a box it was moved to",
            hint="lnk agent list shows the agents here and on every box",
        )
    if asking is not None:
        asking()
    holders, silent = [], []
    for b in agents_on_boxes():
        if b.agents is None:
            silent.append(b.box)
        elif any(r.name == name for r in b.agents):
            holders.append(b.box)
    if len(holders) == 1:
        return _on_box(machine, holders[0], name)
    if holders:
        raise UsageError(
            f"boxes {', '.join(holders)} each hold an agent named {name!r}",
            hint="say which with --from BOX",
        )
    raise NotFound(
        f"no agent named {name!r} here or on a box"
        + (f" ({', '.join(silent)} did not answer)" if silent else ""),
        hint="lnk agent list shows the agents here and on every box",
    )


def status_anywhere(machine: Machine, name: str | None) -> Status:
    """Status here, or through the box this computer moved the agent to (its own lnk
    answers; its ``place`` is then that box)."""
    if name is not None and not machine.settings_file(name).exists():
        locs = locations(machine)
        if name in locs:
            leg = place_leg(machine, locs[name]["place"])
            st = leg.ask(["agent", "status", "--agent", name, "--json"], Status)
            return replace(st, place=locs[name]["place"])
    return service.status(registry.find(machine, name))


def list_everywhere(machine: Machine, *, ask_boxes: bool = True) -> AgentList:
    """The agents here and on every box this computer can reach (the boxes asked at once).

    A box that fails is under ``unanswered``; an agent this computer moved to a
    box that didn't answer, or no longer holds it, is still a row, saying so.
    """
    rows: list[AgentRow] = []
    for a in registry.list_agents(machine):
        st = service.status(a, ask=False)
        rows.append(
            AgentRow(
                name=st.name,
                id=st.id,
                place=HERE,
                state=st.state,
                running=st.running,
                owner=st.owner,
                folder=str(a.folders.root),
                sandboxed=st.sandboxed,
                port=st.ports[0] if st.ports else None,
                bots=public(a.settings.bots),
            )
        )
    seen = {r.id for r in rows}
    unanswered: list[Unanswered] = []
    answered: set[str] = set()
    if ask_boxes:
        for b in agents_on_boxes():
            if b.agents is None:
                unanswered.append(Unanswered(b.box, b.error or "no answer"))
                continue
            answered.add(b.box)
            for r in b.agents:
                if r.id not in seen:
                    seen.add(r.id)
                    rows.append(replace(r, place=b.box, folder=""))
    for name, loc in sorted(locations(machine).items()):
        if loc["id"] in seen:
            continue
        state = f"on box {loc['place']}"
        if loc["place"] in answered:
            state += " (not there now)"
        elif ask_boxes:
            state += " (did not answer)"
        rows.append(AgentRow(name=name, id=loc["id"], place=loc["place"], state=state))
    return AgentList(tuple(rows), tuple(unanswered))


# --- the agents on every box --------------------------------------------------


@dataclass
class BoxAgents:
    """What one box said about its own agents, or why it said nothing."""

    box: str
    agents: list[AgentRow] | None = None
    error: str | None = None


def _ask_agents(box: Box, timeout: float) -> BoxAgents:
    leg = box.leg()
    for args in (["agent", "list", "--here", "--json"], ["agent", "list", "--json"]):
        try:
            p = leg.popen(args)
        except LnkError as e:
            return BoxAgents(box.name, error=e.message)
        with p:
            try:
                out = p.read_answer(timeout=timeout)
            except (LnkError, subprocess.TimeoutExpired) as e:
                why = e.message if isinstance(e, LnkError) else "no answer in time"
                return BoxAgents(box.name, error=why)
            if p.proc.returncode == 2 and "--here" in args:
                continue  # an lnk older than --here: its own agents are the rows placed "here"
            try:
                leg.check(p.proc.returncode, p.stderr_text())
                listing = decode(out, AgentList, leg.name)
            except (LnkError, ProtocolError) as e:
                return BoxAgents(box.name, error=e.message)
        return BoxAgents(box.name, agents=[r for r in listing.agents if r.place == HERE])
    return BoxAgents(box.name, error="no answer")


def agents_on_boxes(timeout: float = 20.0) -> list[BoxAgents]:
    """Ask every added box, at once, which agents live there (its own, not its boxes')."""
    found = boxes.list_boxes()
    if not found:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(found))) as pool:
        return list(pool.map(lambda b: _ask_agents(b, timeout), found))
