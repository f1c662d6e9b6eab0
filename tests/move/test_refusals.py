"""Moves that must fail cleanly: a full disk, a box that stops answering, another stream
format, a name taken at the destination."""

from __future__ import annotations

import subprocess
from pathlib import Path

from move_helpers import AGENT, HERE, PYTHON, World, make_agent, put_file

from lnk.errors import Refused

SSHFAULT = Path(__file__).with_name("sshfault.py")


def _answers_here(world: World, agent_id: str) -> None:
    assert world.exactly_one(agent_id) == HERE
    assert world.journal_empty()


def test_disk_full_at_the_destination(world: World) -> None:
    agent_id = make_agent(world)
    put_file(world, HERE, "big.bin", 4 << 20)
    box = world.boxes["b1"]
    small = box / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        # the agents' folder and the receivers' on the one small filesystem (a receive
        # stages there and renames into place)
        (small / "Agents").mkdir()
        (small / "receivers").mkdir(mode=0o700)
        (box / "Link").mkdir(parents=True, exist_ok=True)
        (box / "Link" / "Agents").symlink_to(small / "Agents")
        (box / ".lnk").mkdir(exist_ok=True)
        receivers = box / ".lnk" / "receivers"
        if receivers.is_dir():
            receivers.rmdir()
        receivers.symlink_to(small / "receivers")
        r = world.lnk("agent", "move", "--agent", AGENT, "--to", "b1")
        assert r.code != 0 and r.err.count("lnk: error:") == 1, r.err
        assert "another filesystem" not in r.err and "Traceback" not in r.err, r.err
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)
    _answers_here(world, agent_id)


def test_a_destination_whose_agents_are_on_another_filesystem(world: World) -> None:
    """Refused at the prepare, in one line; the agent answers here, nothing sent."""
    agent_id = make_agent(world)
    box = world.boxes["b1"]
    other = box / "other"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(other)], check=True)
    try:
        (box / "Link").mkdir(parents=True, exist_ok=True)
        (box / "Link" / "Agents").symlink_to(other)
        r = world.lnk("agent", "move", "--agent", AGENT, "--to", "b1")
        assert r.code == 6 and r.err.count("lnk: error:") == 1, r.err
        assert "is on another filesystem than" in r.err and "Traceback" not in r.err
        assert list(other.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(other)], check=True)
    _answers_here(world, agent_id)


def test_a_box_that_stops_answering(ssh_world: World, tmp_path: Path) -> None:
    """hostA goes down once the final stream committed there: the agent resumes here, the
    journal keeps the move until hostA answers, and the next start removes its copy there."""
    agent_id = make_agent(ssh_world)
    down = tmp_path / "down"
    env = {
        "LNK_SSH_COMMAND": f"{PYTHON} {SSHFAULT} {ssh_world.env['LNK_SSH_COMMAND'][4:]}",
        "SSHFAULT": "state-receive --receiver|after",
        "SSHFAULT_NTH": "2",
        "SSHFAULT_ONCE": str(tmp_path / "fired"),
        "SSHFAULT_DOWN": str(down),
    }
    r = ssh_world.lnk("agent", "move", "--agent", AGENT, "--to", "hostA", env=env)
    assert r.code != 0 and down.exists(), r.err
    st = ssh_world.status(HERE)
    assert st is not None and st["running"] and st["id"] == agent_id
    assert not ssh_world.journal_empty(), "the move's entry was dropped while hostA is down"
    assert ssh_world.has_settings("hostA")  # the stale copy, not removed yet
    r = ssh_world.lnk("agent", "start", "--agent", AGENT, env=env)  # still down: stays
    assert not ssh_world.journal_empty()
    down.unlink()
    ssh_world.ok("agent", "start", "--agent", AGENT, env=env)
    assert not ssh_world.has_settings("hostA")
    _answers_here(ssh_world, agent_id)


def test_a_box_that_does_not_answer_is_tried_once(ssh_world: World, tmp_path: Path) -> None:
    """A move to a box that does not answer fails at its first step (its server's start,
    which is also the version check) with ssh's own line, and tries no second connection:
    behind a dead box each try is a connection timeout."""
    agent_id = make_agent(ssh_world)
    tries = tmp_path / "tries"
    fake = tmp_path / "ssh-down"
    fake.write_text(
        f'#!/bin/sh\necho "$*" >> "{tries}"\n'
        'echo "ssh: connect to host hostA port 22: Connection timed out" >&2\nexit 255\n'
    )
    fake.chmod(0o755)
    env = {"LNK_SSH_COMMAND": str(fake)}
    r = ssh_world.lnk("agent", "move", "--agent", AGENT, "--to", "hostA", env=env)
    assert r.code != 0 and r.err.count("lnk: error:") == 1 and "Traceback" not in r.err, r.err
    assert "Connection timed out" in r.err, r.err
    assert len(tries.read_text().splitlines()) == 1, tries.read_text()
    _answers_here(ssh_world, agent_id)


def test_a_newer_box_of_another_stream_format_is_refused(ssh_world: World, tmp_path: Path) -> None:
    """A box whose lnk is newer and speaks another format can't be upgraded by this one."""
    agent_id = make_agent(ssh_world)
    fake = tmp_path / "new-lnk"
    # it says so when asked its version, and when its server starts (a move's first step)
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = version ]; then\n'
        '  echo \'{"version": "99.0", "stream_format": 5}\'; exit 0\nfi\n'
        'case " $* " in *" box serve --json "*)\n'
        '  lnk "$@" | python3 -c \'import json, sys; d = json.load(sys.stdin); '
        'd.update(version="99.0", stream_format=5); print(json.dumps(d))\'; exit ;;\nesac\n'
        'exec lnk "$@"\n'
    )
    fake.chmod(0o755)
    r = ssh_world.lnk(
        "agent", "move", "--agent", AGENT, "--to", "hostA", env={"LNK_REMOTE_LNK": str(fake)}
    )
    assert r.code == Refused.exit_code, r.err
    assert "stream format 5" in r.err and "newer than this lnk" in r.err, r.err
    assert "upgrade lnk on this computer" in r.err
    assert not (ssh_world.boxes["hostA"] / ".lnk" / "receivers").exists()
    assert not (ssh_world.boxes["hostA"] / ".local").exists(), "nothing was installed there"
    _answers_here(ssh_world, agent_id)


def test_a_name_taken_at_the_destination(world: World) -> None:
    agent_id = make_agent(world)
    other = world.ok("agent", "create", AGENT, "--json", env={"HOME": str(world.boxes["b1"])})
    r = world.lnk("agent", "move", "--agent", AGENT, "--to", "b1")
    assert r.code != 0 and "already" in r.err, r.err
    st = world.status("b1")
    assert st is not None and st["id"] == other.json()["id"] != agent_id
    receivers = world.boxes["b1"] / ".lnk" / "receivers"
    assert not receivers.exists() or not list(receivers.iterdir())
    st = world.status(HERE)
    assert st is not None and st["running"] and st["id"] == agent_id
    assert world.journal_empty()


def test_grants_the_destination_can_t_hold_refuse_the_move_before_its_bulk(
    world: World,
) -> None:
    """A box-born agent whose grants name [commands]: the move here is refused before
    anything is sent (not found after the pause), with the line that mends it where the
    agent lives; mended there, it moves."""
    box = world.boxes["b1"]
    world.ok("box", "run", "b1", "--", "agent", "create", AGENT)
    grants = box / "Link" / "Agents" / AGENT / "Config" / "sandbox.toml"
    grants.write_text(grants.read_text() + '\n[commands]\nallow = ["git"]\n')
    before = sorted(p.name for p in (world.here / "Link").glob("Agents/*"))
    r = world.lnk("agent", "move", "--agent", AGENT, "--from", "b1", "--here")
    assert r.code == 6 and "[commands]" in r.err and "nothing was sent" in r.err, r.err
    hint = next(line for line in r.err.splitlines() if line.startswith("lnk: hint: "))
    line = hint.removeprefix("lnk: hint: ")
    assert line == f"lnk box run b1 -- agent deny --agent {AGENT} --command git", line
    assert sorted(p.name for p in (world.here / "Link").glob("Agents/*")) == before
    assert not list((world.here / ".lnk" / "receivers").glob("rcv-*"))
    assert world.journal_empty()
    # the hint runs, where the agent lives, and then the move goes through
    world.ok(*line.split()[1:])
    assert "[commands]" not in grants.read_text() or "git" not in grants.read_text()
    world.ok("agent", "move", "--agent", AGENT, "--from", "b1", "--here", "--no-start")
    assert world.has_settings(HERE) and not world.has_settings("b1")


def test_allow_refuses_a_grant_this_machine_can_t_hold(world: World) -> None:
    world.ok("agent", "create", AGENT)
    for flag, value in (("--command", "git"), ("--tool", "x"), ("--browser-host", "h")):
        r = world.lnk("agent", "allow", "--agent", AGENT, flag, value)
        assert r.code == 6 and f"can't hold {flag}" in r.err, r.err


def test_a_destination_without_the_agents_harness(world: World) -> None:
    """The agent's harness has no adapter at the destination: refused before the bulk (else it
    would land where nothing starts it), one line naming the adapter; it stays here, whole."""
    agent_id = make_agent(world)
    world.ok("agent", "stop", "--agent", AGENT)
    settings = world.here / ".config" / "lnk" / "agents" / f"{AGENT}.toml"
    text = settings.read_text()
    assert 'harness = "builtin"' in text
    settings.write_text(text.replace('harness = "builtin"', 'harness = "ghost"'))
    r = world.lnk("agent", "move", "--agent", AGENT, "--to", "b1")
    assert r.code != 0 and r.err.count("lnk: error:") == 1, r.err
    assert "(lnk-ghost is not on its PATH); nothing was sent" in r.err
    assert r.err.endswith("then lnk agent move --agent work --to b1\n"), r.err
    assert "Traceback" not in r.err
    assert world.has_settings(HERE) and not world.has_settings("b1")
    assert world.journal_empty()
    assert not (world.home_of("b1") / "Link" / "Agents" / AGENT).exists()
    settings.write_text(text)  # back to its harness: it moves
    world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
    assert world.has_settings("b1") and not world.has_settings(HERE)
    assert world.lnk("agent", "status", "--agent", AGENT, "--json").code == 0, agent_id


def test_another_agent_of_that_name_at_the_source_is_refused_and_nothing_lingers(
    world: World,
) -> None:
    """The source's status is asked beside the destination's prepare: when another agent
    of that name answers there, the move is refused naming it, the receiver the prepare
    made is abandoned, and the journal is empty."""
    agent_id = make_agent(world)
    world.ok("agent", "move", "--agent", AGENT, "--to", "b1", "--no-start")
    box = {"HOME": str(world.boxes["b1"])}
    world.ok("agent", "remove", AGENT, "--yes", "--files", "delete", env=box)
    other = world.ok("agent", "create", AGENT, "--json", env=box).json()["id"]
    assert other != agent_id
    r = world.lnk("agent", "move", "--agent", AGENT, "--here")
    assert r.code != 0 and r.err.count("lnk: error:") == 1, r.err
    assert f"{AGENT} is not on box b1 as this computer remembers" in r.err, r.err
    assert "lnk: hint: lnk box run b1 -- agent list" in r.err, r.err
    assert not list((world.here / ".lnk" / "receivers").glob("rcv-*"))
    assert world.journal_empty()
    st = world.status("b1")
    assert st is not None and st["id"] == other
