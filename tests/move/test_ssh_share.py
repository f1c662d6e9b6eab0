"""A move's steps at an SSH box share one connection (lnk.transport.share), real sshd.

The proof is the box's own sshd: its log names every connection it accepted,
so a move that opens one master has exactly one more "Accepted publickey".
A logging ssh wrapper records, for each step, the ControlPath it was given
and whether a master's socket was there already; after the move the private
socket folder is gone.  A master killed midway: the next step opens a new
one (the move completes), or the session it carried breaks (the move fails
with one error line and the agent answers where it was).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hosts import Hosts
from move_helpers import AGENT, HERE, PYTHON, World, make_agent

SSHFAULT = Path(__file__).with_name("sshfault.py")

LOGGER = """\
import json, os, sys
args = sys.argv[1:]
path = next((a.split("=", 1)[1] for a in args if a.startswith("ControlPath=")), None)
folder = os.path.dirname(path) if path else None
seen = sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []
with open(os.environ["SSHLOG"], "a") as f:
    f.write(json.dumps({"args": args, "folder": folder, "sockets": seen}) + "\\n")
os.execvp(sys.argv[1], sys.argv[1:])
"""


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """A short XDG_RUNTIME_DIR, so the test knows where lnk's socket folder goes."""
    d = Path(tempfile.mkdtemp(prefix="lnkrt-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def accepted(hosts: Hosts, name: str) -> int:
    """How many connections the box's sshd accepted so far."""
    return (hosts[name].dir / "sshd.log").read_text(errors="replace").count("Accepted publickey")


def logged_env(world: World, tmp_path: Path, rt: Path, **extra: str) -> dict[str, str]:
    script = tmp_path / "sshlog.py"
    script.write_text(LOGGER)
    return {
        "LNK_SSH_COMMAND": f"{PYTHON} {script} {world.env['LNK_SSH_COMMAND']}",
        "SSHLOG": str(tmp_path / "ssh.log"),
        "XDG_RUNTIME_DIR": str(rt),
        **extra,
    }


def steps_logged(tmp_path: Path) -> list[dict[str, Any]]:
    """The ssh commands that ran a step (``-- <command>``), in order."""
    log = tmp_path / "ssh.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [r for r in map(json.loads, lines) if "--" in r["args"]]


def move(world: World, to: str, env: dict[str, str]) -> Any:
    dest = ["--here"] if to == HERE else ["--to", to]
    return world.lnk("agent", "move", "--agent", AGENT, *dest, "--json", env=env)


def test_a_moves_steps_share_one_connection(
    ssh_world: World, ssh_hosts: Hosts, tmp_path: Path, runtime_dir: Path
) -> None:
    agent_id = make_agent(ssh_world)
    for to, box in (("hostA", "hostA"), (HERE, "hostA")):
        (tmp_path / "ssh.log").unlink(missing_ok=True)
        before = accepted(ssh_hosts, box)
        r = move(ssh_world, to, logged_env(ssh_world, tmp_path, runtime_dir))
        assert r.code == 0, r.err
        steps = steps_logged(tmp_path)
        assert len(steps) >= 5, steps  # status, prepare, inventory, bulk, ... start
        # the box's server, started first, says which lnk it is: no version step before it
        commands = [s["args"][-1] for s in steps]
        assert "box serve --json" in commands[0], commands
        assert not any(c.split()[-2:] == ["version", "--json"] for c in commands), commands
        # every later step through the server, called by its caller (no lnk imported)
        assert all(" -I -S " in c and "served.py" in c for c in commands[1:]), commands
        assert accepted(ssh_hosts, box) - before == 1
        folders = {s["folder"] for s in steps}
        assert len(folders) == 1 and None not in folders
        (folder,) = folders
        assert Path(folder).parent == runtime_dir
        assert not steps[0]["sockets"]  # the first step opened the master...
        assert all(s["sockets"] for s in steps[1:])  # ...and every later one found it
        assert not Path(folder).exists()  # closed (ssh -O exit) and removed at the end
        assert not list(runtime_dir.iterdir())
        assert ssh_world.exactly_one(agent_id) == to


def test_sharing_off_opens_a_connection_per_step(
    ssh_world: World, ssh_hosts: Hosts, tmp_path: Path, runtime_dir: Path
) -> None:
    agent_id = make_agent(ssh_world)
    before = accepted(ssh_hosts, "hostA")
    env = logged_env(ssh_world, tmp_path, runtime_dir, LNK_SSH_SHARE="0")
    r = move(ssh_world, "hostA", env)
    assert r.code == 0, r.err
    steps = steps_logged(tmp_path)
    assert steps and all(s["folder"] is None for s in steps)
    assert not any(a.startswith("Control") for s in steps for a in s["args"])
    assert accepted(ssh_hosts, "hostA") - before == len(steps)
    assert ssh_world.exactly_one(agent_id) == "hostA"


def fault_env(world: World, tmp_path: Path, rt: Path, spec: str, nth: int) -> dict[str, str]:
    return {
        "LNK_SSH_COMMAND": f"{PYTHON} {SSHFAULT} {world.env['LNK_SSH_COMMAND'][4:]}",
        "SSHFAULT": spec,
        "SSHFAULT_NTH": str(nth),
        "SSHFAULT_ONCE": str(tmp_path / "fired"),
        "XDG_RUNTIME_DIR": str(rt),
    }


def test_a_master_killed_between_steps_is_opened_again(
    ssh_world: World, ssh_hosts: Hosts, tmp_path: Path, runtime_dir: Path
) -> None:
    agent_id = make_agent(ssh_world)
    before = accepted(ssh_hosts, "hostA")
    # the final's receive (the second): its master is killed just before it runs
    env = fault_env(ssh_world, tmp_path, runtime_dir, "state-receive --receiver|kill-master", 2)
    r = move(ssh_world, "hostA", env)
    assert (tmp_path / "fired").exists()
    assert r.code == 0, r.err
    assert accepted(ssh_hosts, "hostA") - before == 2  # the first master, then its successor
    assert ssh_world.exactly_one(agent_id) == "hostA"
    assert ssh_world.journal_empty()
    assert not list(runtime_dir.iterdir())


def test_a_master_killed_under_a_running_step_fails_the_move_cleanly(
    ssh_world: World, tmp_path: Path, runtime_dir: Path
) -> None:
    agent_id = make_agent(ssh_world)
    spec = "state-receive --receiver|kill-master-live"
    r = move(ssh_world, "hostA", fault_env(ssh_world, tmp_path, runtime_dir, spec, 2))
    assert (tmp_path / "fired").exists()
    assert r.code != 0
    assert "Traceback" not in r.err
    assert len(re.findall(r"(?m)^lnk: error:", r.err)) == 1, r.err
    ssh_world.lnk("agent", "start", "--agent", AGENT)  # the recovery, as after any fault
    assert ssh_world.exactly_one(agent_id) == HERE
    assert ssh_world.journal_empty()
    assert not list(runtime_dir.iterdir())


def test_a_sender_whose_digests_fail_leaves_the_agent_where_it_was(
    ssh_world: World, tmp_path: Path, runtime_dir: Path
) -> None:
    """The sender's folder digests (asked for beside the prepare) broken: the move back
    fails before anything is sent, with one error line, and the agent answers where it was."""
    agent_id = make_agent(ssh_world)
    assert move(ssh_world, "hostA", {}).code == 0  # here keeps its folders: a base
    env = fault_env(ssh_world, tmp_path, runtime_dir, "state-digests|before", 1)
    r = move(ssh_world, HERE, env)
    assert (tmp_path / "fired").exists()
    assert r.code != 0 and "Traceback" not in r.err
    assert len(re.findall(r"(?m)^lnk: error:", r.err)) == 1, r.err
    assert ssh_world.exactly_one(agent_id) == "hostA"
    assert ssh_world.journal_empty()
    assert not list(runtime_dir.iterdir())
