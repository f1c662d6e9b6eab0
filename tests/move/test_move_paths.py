"""lnk agent move on every path: here -> box -> box -> here, over local boxes and real SSH.

After each move the agent answers where it went with its ID, the copy left
behind is gone (settings deleted, files in ~/Link/Moved, a note, start
refused), and messages sent from this computer during the move are each
answered exactly once.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from move_helpers import AGENT, HERE, Chatter, World, check_left, make_agent, put_file

MIB = 1 << 20


def _move(world: World, to: str, *extra: str) -> dict[str, Any]:
    dest = ["--here"] if to == HERE else ["--to", to]
    return dict(world.ok("agent", "move", "--agent", AGENT, *dest, "--json", *extra).json())


def _tour(world: World, a: str, b: str) -> None:
    agent_id = make_agent(world)
    put_file(world, HERE, "big.bin", 2 * MIB)
    places = [HERE, a, b, HERE]
    for n, (src, dst) in enumerate(itertools.pairwise(places)):
        with Chatter(world, f"{src}-{dst}-{n}") as chat:
            result = _move(world, dst)
            chat.stop()
        assert result["id"] == agent_id and result["to"] == dst
        st = world.status(dst)
        assert st is not None and st["running"] and st["id"] == agent_id
        assert world.exactly_one(agent_id) == dst
        check_left(world, src, agent_id, "this computer" if dst == HERE else dst)
        chat.check(world, dst)
        assert world.journal_empty()
        if n == 0:  # the first move carries the file
            assert result["bulk"]["data_bytes"] >= 2 * MIB
        if dst == HERE:  # back where it was: only what changed since travels
            assert result["bulk"]["data_bytes"] + result["final"]["data_bytes"] < MIB


def test_here_box_box_here_local(world: World) -> None:
    _tour(world, "b1", "b2")


def test_here_box_box_here_ssh(ssh_world: World) -> None:
    _tour(ssh_world, "hostA", "hostB")


@pytest.mark.parametrize("box", ["b1", "hostA"])
def test_no_start(box: str, request: pytest.FixtureRequest) -> None:
    world: World = request.getfixturevalue("world" if box == "b1" else "ssh_world")
    agent_id = make_agent(world)
    result = _move(world, box, "--no-start")
    assert result["started"] is False
    st = world.status(box)
    assert st is not None and st["id"] == agent_id and not st["running"]
    assert not world.has_settings(HERE)
    check_left(world, HERE, agent_id, box)
    world.ok("box", "run", box, "--", "agent", "start", "--agent", AGENT)
    assert world.exactly_one(agent_id) == box


def test_move_back_sends_only_what_changed(world: World) -> None:
    agent_id = make_agent(world)
    put_file(world, HERE, "big.bin", 3 * MIB)
    first = _move(world, "b1")
    assert first["bulk"]["data_bytes"] >= 3 * MIB
    put_file(world, "b1", "new.bin", 100_000)
    back = _move(world, HERE)
    carried = back["bulk"]["data_bytes"] + back["final"]["data_bytes"]
    assert 100_000 <= carried < MIB, back
    assert back["inventories"] == 2  # the bulk staged the new file: the final asks again
    again = _move(world, "b1")  # and to the box it left: its kept files count too
    assert again["bulk"]["data_bytes"] + again["final"]["data_bytes"] < MIB, again
    # the bulk staged nothing: its inventory serves the final (one walk fewer each end)
    assert again["bulk"]["data_bytes"] == 0 and again["inventories"] == 1
    assert world.exactly_one(agent_id) == "b1"
