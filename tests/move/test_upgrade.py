"""``lnk agent move`` upgrades a box whose lnk is older than the mover, as ``box add`` does."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from hosts import Hosts
from move_helpers import AGENT, World, kill_agents, make_agent

import lnk
from lnk.formats import FORMAT as STREAM_FORMAT

OLD_LNK = (
    '#!/bin/sh\n[ "$1" = --version ] && { echo "lnk, version 0.0.1"; exit 0; }\n'
    'echo "Error: No such command" >&2; exit 2\n'
)


def test_move_upgrades_an_older_box(home: Path, ssh_hosts: Hosts) -> None:
    c = ssh_hosts["hostC"]  # python3, no lnk until box add installs it
    w = World(here=home, env={"LNK_SSH_COMMAND": ssh_hosts.ssh_command})
    assert ssh_hosts.ssh("hostC", 'rm -rf "$HOME/.local"').returncode == 0
    try:
        w.ok("box", "add", "c", "hostC")
        w.boxes["c"] = c.home
        installed = c.home / ".local" / "bin" / "lnk"
        installed.write_text(OLD_LNK)  # the box's lnk is now an older one
        r = w.lnk("box", "run", "c", "--", "version", "--json")
        assert r.code != 0, "the box should answer as an old lnk"

        agent_id = make_agent(w)
        # --no-start: an agent arrives sandboxed, and hostC's python3 (a link under the
        # host's folder) is not inside a sandbox; a person turns it off there
        moved = w.ok("agent", "move", "--agent", AGENT, "--to", "c", "--no-start", "--json")
        assert "box c: upgraded lnk 0.0.1" in moved.err, moved.err
        assert moved.json()["id"] == agent_id
        w.ok("box", "run", "c", "--", "agent", "start", "--agent", AGENT, "--no-sandbox")
        info = json.loads(ssh_hosts.ssh("hostC", "lnk version --json").stdout)
        assert (info["version"], info["stream_format"]) == (lnk.__version__, STREAM_FORMAT)
        assert w.exactly_one(agent_id) == "c"
        assert w.journal_empty()
    finally:
        kill_agents([home, c.home])
        for child in c.home.iterdir():
            with contextlib.suppress(OSError):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink()
