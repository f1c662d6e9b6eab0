"""A file written after the final's inventory costs its own bytes in the pause, not its
folder's (docs/stream-format.md 7.7, "Unchanged since the digests").

The agent moves to box b1 and back.  On the way back, once the agent is paused (after
the final's inventory named its folders held whole here), one file of a folder of
thirty changes at b1: the final walks into that folder and sends that file's bytes;
its twenty-nine neighbours, unchanged since the digests, go without theirs.  The
agent arrives as it is at b1.  A real ``lnk agent move`` (its mover in a child
process, with a hook at the fault point ``move:after-pause``), local boxes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from move_helpers import AGENT, HERE, World, make_agent, put_file

FILES = 30
SIZE = 20_000

MOVE_WITH_A_CHANGE = """
import json, sys
from pathlib import Path
from lnk.agents.layout import Machine
from lnk.move import move as mv
here, changed = sys.argv[1:3]
orig = mv.fault
def hook(point):
    if point == "move:after-pause":  # the final's inventory was taken before the pause
        Path(changed).write_bytes(b"changed while the agent was paused\\n" * 100)  # = new
    orig(point)
mv.fault = hook
out = mv.move(Machine(Path(here)), "work", "here", no_start=True)
print(json.dumps({"bulk": out["bulk"], "final": out["final"]}))
"""


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_file_changed_after_the_finals_inventory_sends_only_itself(world: World) -> None:
    make_agent(world)
    for i in range(FILES):
        put_file(world, HERE, f"proj/f{i:02}.bin", SIZE)
    world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
    # a file placed in the last two seconds is never vouched for by its change time
    # (stream-format.md 7.7): the move back comes after that
    time.sleep(2.5)
    there = world.boxes["b1"] / "Link" / "Agents" / AGENT / "Home" / "proj"
    changed = there / "f07.bin"
    new = b"changed while the agent was paused\n" * 100
    want = {p.name: _digest(p) for p in there.iterdir()} | {
        "f07.bin": hashlib.sha256(new).hexdigest()
    }
    env = {**os.environ, **world.env, "HOME": str(world.here)}
    r = subprocess.run(
        [sys.executable, "-c", MOVE_WITH_A_CHANGE, str(world.here), str(changed)],
        capture_output=True,
        env=env,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
    final = out["final"]
    assert SIZE > final["data_bytes"] >= len(new)
    here = world.here / "Link" / "Agents" / AGENT / "Home" / "proj"
    assert {p.name: _digest(p) for p in here.iterdir()} == want
