"""The fault-injection matrix: kill -9 each process of a move at each step.

Victims: the mover (``lnk agent move``, at its named phase boundaries), the
sender (``state-send``) and the receiver (``state-receive``) mid-stream, and
the ssh clients that carry a box's legs.  After each fault the recovery the
design names runs (``lnk agent start --agent work`` on this computer), then:
exactly one place runs the agent with its ID, the others hold no settings of
it, every message sent from this computer meanwhile was answered exactly once,
and neither the journal nor the held folder keeps anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from move_helpers import AGENT, HERE, PYTHON, Chatter, World, make_agent

SSHFAULT = Path(__file__).with_name("sshfault.py")

# (victim, point, where the agent ends up: "src" or "dst")
LOCAL = [
    ("mover", "move:after-prepare", "src"),
    ("mover", "move:after-bulk", "src"),
    ("mover", "move:after-pause", "src"),
    ("mover", "move:after-commit", "dst"),
    ("mover", "move:after-start", "dst"),
    ("sender", "send:mid-bulk", "src"),
    ("sender", "send:mid-final", "src"),
    ("receiver", "receive:mid-bulk", "src"),
    ("receiver", "receive:mid-final", "src"),
]
BOX_TO_BOX = [
    c
    for c in LOCAL
    if c[1] in ("move:after-pause", "move:after-commit", "send:mid-final", "receive:mid-final")
]


def _run_fault(
    world: World, src: str, dst: str, fault_env: dict[str, str], ends: str, tag: str
) -> None:
    agent_id = make_agent(world)
    if src != HERE:
        world.ok("agent", "move", "--agent", AGENT, "--to", src)
    with Chatter(world, tag) as chat:
        dest = ["--here"] if dst == HERE else ["--to", dst]
        moved = world.lnk("agent", "move", "--agent", AGENT, *dest, "--json", env=fault_env)
        assert moved.code != 0, "the fault did not fire"
        world.lnk("agent", "start", "--agent", AGENT)  # the recovery: finishes the journal
        chat.stop()
    assert world.journal_empty(), list((world.here / ".lnk" / "journal").iterdir())
    where = world.exactly_one(agent_id)
    assert where == (src if ends == "src" else dst)
    chat.check(world, where)


@pytest.mark.parametrize(("victim", "point", "ends"), LOCAL, ids=[c[1] for c in LOCAL])
def test_fault_local_here_to_box(world: World, victim: str, point: str, ends: str) -> None:
    _run_fault(world, HERE, "b1", {"LNK_FAULT": point}, ends, f"{victim}-{point}")


@pytest.mark.parametrize(("victim", "point", "ends"), BOX_TO_BOX, ids=[c[1] for c in BOX_TO_BOX])
def test_fault_local_box_to_box(world: World, victim: str, point: str, ends: str) -> None:
    _run_fault(world, "b1", "b2", {"LNK_FAULT": point}, ends, f"bb-{victim}-{point}")


def _ssh_env(world: World, tmp_path: Path, spec: str = "", nth: int = 1) -> dict[str, str]:
    return {
        "LNK_SSH_COMMAND": f"{PYTHON} {SSHFAULT} {world.env['LNK_SSH_COMMAND'][4:]}",
        "SSHFAULT": spec,
        "SSHFAULT_NTH": str(nth),
        "SSHFAULT_ONCE": str(tmp_path / "fired"),
        "SSHFAULT_DOWN": str(tmp_path / "down"),
    }


SSH = [  # (victim, how, where it ends)
    ("mover", "move:after-pause", "src"),
    ("receiver", "receive:mid-final", "src"),
    ("ssh", "agent pause|after", "src"),  # the box paused, its ssh killed after
    ("ssh", "--phase final|mid-out", "src"),  # out of the box, mid-final
    ("ssh", "agent start|after", "src"),  # the box started it, its ssh killed: undone
]


@pytest.mark.parametrize(("victim", "how", "ends"), SSH, ids=[c[1] for c in SSH])
def test_fault_ssh_box_to_box(
    ssh_world: World, tmp_path: Path, victim: str, how: str, ends: str
) -> None:
    """hostA -> hostB: both legs run over SSH from this computer."""
    env = _ssh_env(ssh_world, tmp_path, how) if victim == "ssh" else {"LNK_FAULT": how}
    _run_fault(ssh_world, "hostA", "hostB", env, ends, f"ssh-{victim}")
