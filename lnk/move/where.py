"""Where an agent is: here, on the box it was moved to, or on any added box.

This computer knows the agents it holds, the ones it moved to a box
(``~/.lnk/locations.json``), and it can ask every added box for its own
agents (``lnk agent list --here --json`` there), which finds an agent created
or restored on a box.  A box that does not answer is named, never skipped in
silence.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.errors import NotFound, UsageError
from lnk.move import journal
from lnk.runtime import service
from lnk.transport import boxes
from lnk.transport.legs import Leg, LocalLeg

HERE = "here"
Say = Callable[[str], None]


def place_leg(machine: Machine, place: str) -> Leg:
    if place == HERE:
        return LocalLeg(machine.home, name="this computer")
    return boxes.get(place).leg()


def _on_box(machine: Machine, box: str, name: str) -> tuple[str, str, str]:
    leg = place_leg(machine, box)
    st = json.loads(leg.run(["agent", "status", "--agent", name, "--json"]).stdout)
    if st.get("place", HERE) != HERE:  # its lnk asked another place: not on that box itself
        raise NotFound(
            f"{name} is not on box {box} itself (it is on {st['place']} from there)",
            hint=f"name the box it is on: --from {st['place']}",
        )
    return name, str(st["id"]), box


def where_is(
    machine: Machine, name: str | None, from_box: str | None = None, *, ask_boxes: bool = True
) -> tuple[str, str, str]:
    """(name, id, place) of the agent: here, where this computer moved it, or on a box.

    ``from_box`` names the box it is on (one created or restored there); without
    it, an agent neither here nor moved from here is looked for on every box
    (unless ``ask_boxes`` is False).
    """
    if from_box is not None and from_box != HERE:
        if name is None:
            raise UsageError(f"say which agent on {from_box}", hint="add --agent NAME")
        return _on_box(machine, from_box, name)
    locs = journal.locations(machine)
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
        return name, a.id, HERE
    if from_box == HERE:
        raise NotFound(f"no agent named {name!r} on this computer", hint="lnk agent list")
    if name in locs:
        return name, locs[name]["id"], locs[name]["place"]
    if not ask_boxes:
        raise NotFound(
            f"no agent named {name!r} here or on a box it was moved to",
            hint="lnk agent list shows the agents here and on every box",
        )
    holders, silent = [], []
    for b in boxes.agents_on_boxes():
        if b.agents is None:
            silent.append(b.box)
        elif any(r.get("name") == name for r in b.agents):
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


def list_everywhere(machine: Machine, *, ask_boxes: bool = True) -> dict[str, Any]:
    """The agents here and on every box this computer can reach.

    ``{"agents": [rows], "unanswered": [{"box", "error"}]}``: each row has the
    agent's ``name``, ``id``, ``place`` (``here`` or a box) and ``state``.
    """
    rows: list[dict[str, Any]] = [
        service.status(a, ask=False) | {"folder": str(a.folders.root), "place": HERE}
        for a in registry.list_agents(machine)
    ]
    seen = {r["id"] for r in rows}
    unanswered: list[dict[str, str]] = []
    answered: set[str] = set()
    if ask_boxes:
        for b in boxes.agents_on_boxes():
            if b.agents is None:
                unanswered.append({"box": b.box, "error": b.error or "no answer"})
                continue
            answered.add(b.box)
            for r in b.agents:
                if r.get("place", HERE) == HERE and r.get("id") not in seen:
                    seen.add(r.get("id"))
                    rows.append(dict(r) | {"place": b.box})
    for name, loc in sorted(journal.locations(machine).items()):
        if loc["id"] in seen:
            continue
        state = f"on box {loc['place']}"
        if loc["place"] in answered:
            state += " (not there now)"
        elif ask_boxes:
            state += " (did not answer)"
        rows.append({"name": name, "id": loc["id"], "place": loc["place"], "state": state})
    return {"agents": rows, "unanswered": unanswered}


def status_anywhere(machine: Machine, name: str | None) -> dict[str, Any]:
    """Status here, or through the box the agent is on (its own lnk answers)."""
    if name is not None and not machine.settings_file(name).exists():
        locs = journal.locations(machine)
        if name in locs:
            leg = place_leg(machine, locs[name]["place"])
            st = json.loads(leg.run(["agent", "status", "--agent", name, "--json"]).stdout)
            return dict(st) | {"place": locs[name]["place"]}
    return service.status(registry.find(machine, name)) | {"place": HERE}
