"""Grants follow the seed's rule (decisions.txt, "The agent's grants").

The computer running the move sends the agent's grants when the agent leaves
it; an agent coming back keeps the grants it has there (its copy left in
~/Link/Moved/ included); one arriving any other way gets the stream's minus the
wide ones.
"""

from __future__ import annotations

import tomllib

from move_helpers import AGENT, HERE, World, make_agent
from trust_helpers import grants_file, read_settings

MINE = """[files]
write = ["."]
read = ["~"]

[network]
mode = "host"

[ports]
allow = [5432]
"""


def _grants(world: World, place: str) -> dict:
    return tomllib.loads(grants_file(world.home_of(place)).read_text())


def test_a_round_trip_here_box_here_keeps_every_grant(world: World) -> None:
    agent_id = make_agent(world)
    grants_file(world.here).write_text(MINE)
    r = world.ok("agent", "move", "--to", "b1", "--json")
    assert r.json()["final"]["grants_from"] == "mover"
    assert r.json()["final"]["dropped_grants"] == []
    # the box got them whole: the person's own word, sent as the agent left here
    assert _grants(world, "b1") == tomllib.loads(MINE)
    # the box keeps its own switch: arrived sandboxed, the move named the command
    assert read_settings(world.boxes["b1"])["sandbox"] is True
    assert f"lnk agent start --no-sandbox --agent {AGENT}" in r.err
    # while it is away, this computer remembers what it decided for it
    assert (world.here / ".lnk" / "moved" / f"{agent_id}.local.toml").exists()
    # the box writes the stream back: it is not the box's word, the grants here are kept
    r = world.ok("agent", "move", "--here", "--json")
    final = r.json()["final"]
    assert final["grants_from"] == "here" and final["dropped_grants"] == []
    assert _grants(world, HERE) == tomllib.loads(MINE)
    assert "not granted here" not in r.err
    # and this computer's own switch: it ran without a sandbox here, it does again
    assert read_settings(world.here)["sandbox"] is False
    assert not (world.here / ".lnk" / "moved" / f"{agent_id}.local.toml").exists()
    assert world.exactly_one(agent_id) == HERE


def test_an_agent_arriving_any_other_way_gets_the_streams_minus_the_wide_ones(
    world: World,
) -> None:
    """Box to box: the stream is b1's word, so b2 drops the wide grants and names them."""
    world.add_local_box("b2", world.boxes["b1"].parent / "b2-home")
    make_agent(world)
    grants_file(world.here).write_text(MINE)
    world.ok("agent", "move", "--to", "b1")
    # the box widens what the agent may do, then it moves on to another box
    grants_file(world.boxes["b1"]).write_text(MINE + '\n[tcp]\nendpoints = ["evil:22"]\n')
    r = world.ok("agent", "move", "--to", "b2", "--json")
    final = r.json()["final"]
    assert final["grants_from"] == "stream"
    assert {"--read '~'", "--network-mode host", "--port 5432", "--tcp evil:22"} <= set(
        final["dropped_grants"]
    )
    assert _grants(world, "b2") == {"files": {"write": ["."]}}
    assert f"lnk agent allow --tcp evil:22 --agent {AGENT}" in r.err


def test_a_round_trip_through_a_real_ssh_box_keeps_every_grant(ssh_box: World) -> None:
    world = ssh_box
    agent_id = make_agent(world)
    grants_file(world.here).write_text(MINE)
    r = world.ok("agent", "move", "--to", "hostC", "--json")
    assert r.json()["final"]["grants_from"] == "mover"
    assert _grants(world, "hostC") == tomllib.loads(MINE)
    assert read_settings(world.boxes["hostC"])["sandbox"] is True
    r = world.ok("agent", "move", "--here", "--json")
    assert r.json()["final"]["grants_from"] == "here"
    assert r.json()["final"]["dropped_grants"] == []
    assert _grants(world, HERE) == tomllib.loads(MINE)
    assert read_settings(world.here)["sandbox"] is False
    assert world.exactly_one(agent_id) == HERE
