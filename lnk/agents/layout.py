"""Where everything lives, all under the user's HOME.

    ~/.config/lnk/                      settings and keys, outside every sandbox
        agents/<name>.toml              an agent's settings (its ID is read from here alone)
        backup/                         the owner's backup key pair (issue: backups)
    ~/.lnk/                             this machine's state
        machine.toml                    machine settings (unsandboxed, keep_moved, ...)
        agents/<id>/                    runtime state of one agent: pidfile, log, endpoint key,
                                        bridge.pid, bridge.json, connections.hold
        agents/.net/<id>/               the agent's sockets (relay into its sandbox)
        journal/                        unfinished moves
        held/                           messages held during a move
        receivers/<receiver>/           one-time receivers of a sealed stream
    ~/Link/Agents/<name>/               the agent's folders
        Home/                           the person's files and the agent's work
        Agent/                          the agent's brain, a folder per collection:
            instructions/ skills/ memory/ chats/ schedule/
            connections/                the bridge's state (not in the sandbox)
        Config/sandbox.toml             the agent's grants

A test makes a second machine by pointing HOME somewhere else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

AGENT_COLLECTION_DIRS = ("instructions", "skills", "memory", "chats", "schedule")
CONNECTIONS_DIR = "connections"  # Agent/connections/: the bridge's, never in the sandbox
HOLD_FILE = "connections.hold"  # <runtime>/: a move's destination holds its connections


def home_dir() -> Path:
    """The user's HOME as the environment says (so a test can swap machines)."""
    home = os.environ.get("HOME")
    return Path(home) if home else Path.home()


@dataclass(frozen=True)
class Machine:
    """The paths of one machine (one HOME)."""

    home: Path

    @classmethod
    def current(cls) -> Machine:
        return cls(home_dir())

    # settings and keys, outside every sandbox
    @property
    def config_dir(self) -> Path:
        return self.home / ".config" / "lnk"

    @property
    def settings_dir(self) -> Path:
        return self.config_dir / "agents"

    def settings_file(self, name: str) -> Path:
        return self.settings_dir / f"{name}.toml"

    # machine state
    @property
    def state_dir(self) -> Path:
        return self.home / ".lnk"

    @property
    def machine_toml(self) -> Path:
        return self.state_dir / "machine.toml"

    def runtime_dir(self, agent_id: str) -> Path:
        return self.state_dir / "agents" / agent_id

    def hold_file(self, agent_id: str) -> Path:
        """While it exists, the agent's bridge here neither polls nor fires nor sends: a
        move's final phase wrote it, the move's ``moved-in`` step removes it."""
        return self.runtime_dir(agent_id) / HOLD_FILE

    def net_dir(self, agent_id: str) -> Path:
        return self.state_dir / "agents" / ".net" / agent_id

    @property
    def journal_dir(self) -> Path:
        return self.state_dir / "journal"

    @property
    def held_dir(self) -> Path:
        return self.state_dir / "held"

    @property
    def receivers_dir(self) -> Path:
        return self.state_dir / "receivers"

    # the agents' folders
    @property
    def agents_root(self) -> Path:
        return self.home / "Link" / "Agents"

    def folders(self, name: str) -> AgentFolders:
        return AgentFolders(self.agents_root / name)


@dataclass(frozen=True)
class AgentFolders:
    """``~/Link/Agents/<name>/``: Home/, Agent/ and Config/."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "Home"

    @property
    def agent(self) -> Path:
        return self.root / "Agent"

    @property
    def config(self) -> Path:
        return self.root / "Config"

    @property
    def sandbox_toml(self) -> Path:
        return self.config / "sandbox.toml"

    @property
    def chats(self) -> Path:
        return self.agent / "chats"

    @property
    def connections(self) -> Path:
        return self.agent / CONNECTIONS_DIR

    def collection_dir(self, which: str) -> Path:
        if which not in AGENT_COLLECTION_DIRS:
            raise ValueError(f"unknown agent folder {which!r}")
        return self.agent / which

    def make(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        for d in AGENT_COLLECTION_DIRS:
            (self.agent / d).mkdir(parents=True, exist_ok=True)
        self.config.mkdir(parents=True, exist_ok=True)
