"""``lnk demo``: the whole product on embedded defaults, on this machine alone.

Machines are HOME folders under one demo folder: ``a`` (this computer),
``b`` (another machine a backup is restored on) and ``box`` (a box reached
without SSH).  Every step runs the real ``lnk`` command line there.
"""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path

from lnk.transport.legs import LocalLeg

Say = Callable[[str], None]


def run_demo(folder: Path | None, sandbox: bool, say: Say) -> Path:
    root = Path(tempfile.mkdtemp(prefix="lnk-demo-")) if folder is None else folder
    root.mkdir(parents=True, exist_ok=True)
    a, b = LocalLeg(root / "a", name="a"), LocalLeg(root / "b", name="b")
    (root / "backups").mkdir(exist_ok=True)  # a folder standing in for a bucket
    backups = f"file://{root / 'backups'}"

    def step(leg: LocalLeg, *args: str) -> str:
        say(f"[{leg.name}] $ lnk {' '.join(shlex.quote(x) for x in args)}")
        r = leg.run(list(args))
        out = r.stdout.decode().strip()
        for line in [*out.splitlines(), *r.stderr.decode().strip().splitlines()]:
            say(f"      {line}")
        return out

    say(f"demo machines live in {root}: a (this computer), b, and box (a local box)")
    step(a, "agent", "create", "demo")
    step(a, "agent", "start", "--agent", "demo", *([] if sandbox else ["--no-sandbox"]))
    notes = root / "a" / "Link" / "Agents" / "demo" / "Home" / "notes.md"
    notes.write_text("# Notes\n\nA file of yours, in the agent's Home.\n")
    say(f"[a] wrote {notes}")
    step(a, "agent", "chat", "send", "--agent", "demo", "hello")
    step(a, "agent", "status", "--agent", "demo")
    step(a, "agent", "backup", "--agent", "demo", "--to", backups)
    step(a, "agent", "backup", "list", "--from", backups)
    key = a.run(["backup", "key", "export"]).stdout
    say("[a] $ lnk backup key export > key; [b] $ lnk backup key import < key")
    b.run(["backup", "key", "import"], stdin=key)
    step(b, "agent", "restore", "demo", "--from", backups)
    step(b, "agent", "start", "--agent", "demo", *([] if sandbox else ["--no-sandbox"]))
    step(b, "agent", "chat", "send", "--agent", "demo", "hello from b")
    step(b, "agent", "stop", "--agent", "demo")
    # b stood in for a new machine: it lets go of its copy, so one agent lives in one place
    step(b, "agent", "remove", "demo", "--yes", "--files", "delete")
    step(a, "box", "add", "box", "--local", str(root / "box"))
    step(a, "agent", "move", "--to", "box", "--agent", "demo")
    step(a, "agent", "chat", "send", "--agent", "demo", "hello on the box")
    step(a, "agent", "move", "--here", "--agent", "demo")
    step(a, "agent", "chat", "send", "--agent", "demo", "back home")
    step(a, "agent", "stop", "--agent", "demo")
    say(f"done: remove {root} when you have looked around")
    return root
