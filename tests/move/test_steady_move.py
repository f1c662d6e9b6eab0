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
from pathlib import Path
from typing import IO

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
print(json.dumps({k: out[k] for k in ("bulk", "final", "inventories")}))
"""


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_file_changed_after_the_finals_inventory_sends_only_itself(world: World) -> None:
    make_agent(world)
    for i in range(FILES):
        put_file(world, HERE, f"proj/f{i:02}.bin", SIZE)
    # and back at once: what the first move placed a moment ago counts as unchanged
    # since (the digests' time is the file system's own clock: no margin of seconds)
    world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
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
    assert out["inventories"] == 1  # nothing changed before the bulk: its inventory served
    here = world.here / "Link" / "Agents" / AGENT / "Home" / "proj"
    assert {p.name: _digest(p) for p in here.iterdir()} == want


def test_the_bulks_inventory_serves_the_final_only_when_it_can() -> None:
    """The final reuses the bulk's inventory only when the bulk staged nothing at the
    destination and the inventory gives back the time of the sender's digests (an
    older receiver's does not: the changed folders would go whole); it is read from its
    start either way."""
    import tempfile

    from lnk.move.steps import kept_copy, still_holds
    from lnk.payload.inventory import Inventory
    from lnk.protocol import ReceiveReport

    def spooled(data: bytes) -> IO[bytes]:
        f = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the caller's with)
        f.write(data)
        f.seek(0)
        return f

    timed = Inventory.of([b"\x01" * 32])
    timed.dirs, timed.at = {"Home": "ab" * 32}, 1_796_547_003_962_220_660
    untimed = Inventory.of([b"\x01" * 32])
    untimed.dirs = {"Home": "ab" * 32}
    quiet = ReceiveReport(agent="work", id="ag-x", phase="bulk", committed=False)
    busy = ReceiveReport(agent="work", id="ag-x", phase="bulk", committed=False, data_bytes=5)
    for data, report, want in [
        (timed.to_bytes(), quiet, True),
        (timed.to_bytes(), busy, False),
        (untimed.to_bytes(), quiet, False),
        (b"not an inventory", quiet, False),
    ]:
        with spooled(data) as f, kept_copy(f) as copy:
            assert still_holds(report, copy) is want
            assert copy.read() == data == f.read()
