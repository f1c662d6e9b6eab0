"""A real Hermes agent moved to a box over real sshd (a test host: its own network
namespace, sshd and HOME) and back, thinking there with a model the box reaches; the
conversation goes on in the same Hermes session at each end."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts import Hosts
from servers import ModelServer
from test_hermes_agent import KEY, rows
from test_hermes_move import start_chatting, user_said

from tests.move.move_helpers import AGENT, World, kill_agents


@pytest.fixture
def ssh_world(hermes: Path, home: Path, ssh_hosts: Hosts) -> Iterator[World]:
    """This computer and the SSH box hostA, with lnk-hermes installed there (a wrapper in
    its ~/.local/bin handing it the suite's Hermes, as on this computer)."""
    w = World(here=home, env={"LNK_SSH_COMMAND": ssh_hosts.ssh_command})
    box = ssh_hosts["hostA"].home
    try:
        bin_dir = box / ".local" / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        wrapper = bin_dir / "lnk-hermes"
        wrapper.write_text(
            f'#!/bin/sh\nLNK_HERMES_VENV={hermes} exec {sys.executable} -m lnk_hermes.cli "$@"\n'
        )
        wrapper.chmod(0o755)
        w.add_ssh_box("hostA", box)
        yield w
    finally:
        kill_agents([w.here, box])
        with contextlib.suppress(OSError):
            shutil.rmtree(box / ".local")


def chat(w: World, text: str) -> str:
    return str(w.ok("agent", "chat", "send", "--agent", AGENT, "--json", text).json()["answer"])


def test_a_hermes_agent_moves_to_an_ssh_box_and_back(
    ssh_world: World, model: ModelServer, ssh_hosts: Hosts
) -> None:
    w, box = ssh_world, ssh_world.boxes["hostA"]
    hosted = ModelServer("box", host=ssh_hosts.bridge_address)  # what the box reaches
    try:
        start_chatting(w.here, model)
        before = rows(w.here, AGENT)
        w.ok(
            "agent", "move", "--agent", AGENT, "--to", "hostA", "--model", "test-model",
            "--model-url", hosted.base_url, "--key-env", "BOX_KEY", "--key-from-env", "BOX_KEY",
            env={"BOX_KEY": KEY},
        )  # fmt: skip
        assert rows(box, AGENT) == before  # state.db's rows, as they were
        # the box's network is the box's to grant (a grant of your network stays where made)
        lan = ["agent", "allow", "--agent", AGENT, "--tcp", hosted.base_url.split("/")[2]]
        w.ok("box", "run", "hostA", "--", *lan, "--lan-host", ssh_hosts.bridge_address)
        assert chat(w, "over ssh") == "box heard over ssh"
        assert user_said(hosted)[-2:] == ["one", "over ssh"]  # the same session, there
        assert hosted.keys() == [f"Bearer {KEY}"]  # its proxy added the key, there
        there = rows(box, AGENT)
        assert there["sessions"] == before["sessions"] and len(there["messages"]) == 4
        w.ok("agent", "move", "--agent", AGENT, "--here")
        assert rows(w.here, AGENT) == there
        assert chat(w, "home again") == "tm heard home again"
        assert user_said(model)[-3:] == ["one", "over ssh", "home again"]
    except AssertionError:
        for log in (box / ".lnk" / "agents").glob("*/harness.log"):
            print(log.read_text()[-3000:])
        raise
    finally:
        hosted.stop()
