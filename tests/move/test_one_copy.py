"""Exactly one copy: a restore never makes a second copy of an agent that lives elsewhere,
and an agent living on any added box can be listed and moved (``--from BOX``)."""

from __future__ import annotations

import random
import re
from pathlib import Path

from lnkrun import ok
from move_helpers import AGENT, HERE, World, make_agent

from lnk.errors import AlreadyExists


def _backup(world: World, url: str, home: Path | None = None, agent: str = AGENT) -> None:
    env = {"HOME": str(home)} if home else None
    world.ok("agent", "backup", "--agent", agent, "--to", url, env=env)


def _own_ports(home: Path, agent: str) -> None:
    """A random port block, as make_agent gives (other sessions' agents use 20000 up)."""
    settings = home / ".config" / "lnk" / "agents" / f"{agent}.toml"
    base = random.randrange(20000, 32000) // 4 * 4
    settings.write_text(re.sub(r"(?m)^base = \d+$", f"base = {base}", settings.read_text()))


def _rows(world: World) -> list[dict[str, object]]:
    return list(world.ok("agent", "list", "--json").json()["agents"])


def test_restore_of_a_moved_agent_refuses_and_as_restores_a_second(
    world: World, tmp_path: Path
) -> None:
    url = f"file://{tmp_path / 'bucket'}"
    (tmp_path / "bucket").mkdir()
    agent_id = make_agent(world)
    (world.here / "Link" / "Agents" / AGENT / "Home" / "notes.txt").write_text("mine\n")
    _backup(world, url)
    world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
    r = world.lnk("agent", "restore", AGENT, "--from", url)
    assert r.code == AlreadyExists.exit_code, r.err
    assert "b1" in r.err and agent_id in r.err, r.err
    assert "lnk agent move --here --agent work" in r.err
    assert f"lnk: hint: or restore a separate agent with a new ID: lnk agent restore {AGENT}" in (
        r.err
    )
    assert not world.has_settings(HERE)
    # the note and the location still say where it lives
    assert (world.here / ".lnk" / "moved" / f"{agent_id}.json").exists()
    r = world.lnk("agent", "restore", AGENT, "--from", url, "--force")
    assert r.code == AlreadyExists.exit_code, "--force never makes a second copy"

    restored = world.ok("agent", "restore", AGENT, "--from", url, "--as", "work2", "--json").json()
    assert restored["agent"] == "work2" and restored["id"] != agent_id
    home2 = world.here / "Link" / "Agents" / "work2" / "Home" / "notes.txt"
    assert home2.read_text() == "mine\n"
    rows = {r["name"]: r for r in _rows(world)}
    assert rows[AGENT]["id"] == agent_id and rows[AGENT]["place"] == "b1"
    assert rows["work2"]["id"] == restored["id"] and rows["work2"]["place"] == HERE
    # both answer, each with its own ID, and the moved one can still come back
    _own_ports(world.here, "work2")
    world.ok("agent", "start", "--agent", "work2", "--no-sandbox")
    st = world.ok("agent", "status", "--agent", "work2", "--json").json()
    assert st["running"] and st["id"] == restored["id"]
    back = world.ok("agent", "move", "--agent", AGENT, "--here", "--json").json()
    assert back["id"] == agent_id
    assert world.exactly_one(agent_id) == HERE


def test_restore_refuses_an_agent_a_box_holds(world: World, tmp_path: Path) -> None:
    """An agent created on a box and backed up there: this computer knows it only by
    asking its boxes, and refuses to restore a second copy."""
    url = f"file://{tmp_path / 'bucket'}"
    (tmp_path / "bucket").mkdir()
    b1 = world.boxes["b1"]
    key = world.ok("backup", "key", "export").out
    ok("backup", "key", "import", home=b1, input=key)  # the box backs up to this owner's key
    created = world.ok("box", "run", "b1", "--", "agent", "create", "x", "--json").json()
    _backup(world, url, home=b1, agent="x")
    r = world.lnk("agent", "restore", "x", "--from", url)
    assert r.code == AlreadyExists.exit_code, r.err
    assert "it lives on box b1" in r.err and created["id"] in r.err, r.err
    assert not (world.here / ".config" / "lnk" / "agents" / "x.toml").exists()
    r2 = world.ok("agent", "restore", "x", "--from", url, "--as", "y", "--json").json()
    assert r2["id"] != created["id"]
    rows = {r["name"]: r for r in _rows(world)}
    assert rows["x"]["place"] == "b1" and rows["x"]["id"] == created["id"]
    assert rows["y"]["place"] == HERE


def test_box_born_agent_moves_here_with_from(ssh_world: World, ssh_hosts: object) -> None:
    """Created on hostA (never moved from here): listed with the box's agents, moved here
    with --from, and a box that does not answer is named, not skipped."""
    w = ssh_world
    created = w.ok("box", "run", "hostA", "--", "agent", "create", AGENT, "--json").json()
    _own_ports(w.boxes["hostA"], AGENT)
    there = w.ok("box", "run", "hostA", "--", "agent", "list", "--here", "--json").json()
    assert [r["id"] for r in there["agents"]] == [created["id"]]
    with (w.here / ".config" / "lnk" / "boxes.toml").open("a") as f:
        f.write('\n[boxes.down]\ndestination = "hostDown"\n')
    found = w.ok("agent", "list", "--json").json()
    rows = [r for r in found["agents"] if r["name"] == AGENT]
    assert [(r["place"], r["id"]) for r in rows] == [("hostA", created["id"])]
    assert [u["box"] for u in found["unanswered"]] == ["down"]
    assert "cannot reach box down" in found["unanswered"][0]["error"]
    text = w.ok("agent", "list")
    assert "box down did not answer" in text.err and "hostA" in text.out

    # --from names the box; another box that does not answer does not stop it
    moved = w.ok("agent", "move", "--agent", AGENT, "--from", "hostA", "--here", "--json").json()
    assert moved["id"] == created["id"] and moved["from"] == "hostA" and moved["to"] == HERE
    assert w.exactly_one(created["id"]) == HERE
    assert w.journal_empty()

    # and without --from, an agent only a box holds is found by asking the boxes
    w.ok("agent", "stop", "--agent", AGENT)
    w.ok("box", "run", "hostB", "--", "agent", "create", "other", "--json")
    _own_ports(w.boxes["hostB"], "other")
    r = w.ok("agent", "move", "--agent", "other", "--to", "hostA", "--json").json()
    assert r["from"] == "hostB" and r["to"] == "hostA"
    st = w.ok("box", "run", "hostA", "--", "agent", "status", "--agent", "other", "--json").json()
    assert st["running"] and st["id"] == r["id"]
    w.ok("box", "run", "hostA", "--", "agent", "stop", "--agent", "other")
