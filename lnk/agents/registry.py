"""The agents of one machine: create, find, list, remove.

An agent is known by its settings file; everything that runs is keyed by the
ID inside it.  Create is atomic: a failure leaves no folder and no settings.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnk.agents import ports, secrets
from lnk.agents.layout import AgentFolders, Machine
from lnk.agents.machine import account_owner, load_machine
from lnk.agents.settings import (
    ModelSettings,
    Settings,
    check_name,
    load,
    new_agent_id,
    read_raw,
    save,
)
from lnk.errors import AlreadyExists, InvalidInput, NotFound, UsageError
from lnk.fsutil import rmtree

DEFAULT_SANDBOX_TOML = """\
# What this agent may do, in its own terms (lnk agent allow / deny change it).
# Link's defaults: its folders, no network but its proxy, nothing of yours.
[files]
write = ["."]
"""


@dataclass
class Agent:
    machine: Machine
    settings: Settings

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def id(self) -> str:
        return self.settings.id

    @property
    def folders(self) -> AgentFolders:
        return self.machine.folders(self.name)

    @property
    def runtime(self) -> Path:
        return self.machine.runtime_dir(self.id)

    @property
    def net(self) -> Path:
        return self.machine.net_dir(self.id)

    @property
    def settings_path(self) -> Path:
        return self.machine.settings_file(self.name)

    def save(self) -> None:
        save(self.settings_path, self.settings)


def names(machine: Machine) -> list[str]:
    d = machine.settings_dir
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.toml") if not p.name.startswith("."))


def list_agents(machine: Machine) -> list[Agent]:
    return [Agent(machine, load(machine.settings_file(n))) for n in names(machine)]


def find(machine: Machine, name: str | None) -> Agent:
    """The agent named, or the only one when no name is given."""
    if name is None:
        all_names = names(machine)
        if not all_names:
            raise NotFound(
                "there is no agent on this machine", hint="create one with: lnk agent create NAME"
            )
        if len(all_names) > 1:
            raise UsageError(
                f"there are {len(all_names)} agents here ({', '.join(all_names)}); say which",
                hint="add --agent NAME",
            )
        name = all_names[0]
    check_name(name)
    path = machine.settings_file(name)
    if not path.exists():
        raise NotFound(
            f"no agent named {name!r} on this machine", hint="lnk agent list shows the agents here"
        )
    return Agent(machine, load(path))


def find_by_id(machine: Machine, agent_id: str) -> Agent | None:
    for n in names(machine):
        try:
            raw = read_raw(machine.settings_file(n))
        except InvalidInput:
            continue
        if raw.get("id") == agent_id:
            return Agent(machine, load(machine.settings_file(n)))
    return None


def taken_blocks(machine: Machine, except_name: str | None = None) -> list[tuple[int, int]]:
    blocks = []
    for n in names(machine):
        if n == except_name:
            continue
        try:
            raw = read_raw(machine.settings_file(n))
        except InvalidInput:
            continue
        p = raw.get("ports", {})
        if isinstance(p, dict) and p.get("base"):
            blocks.append((int(p["base"]), int(p.get("count", ports.BLOCK))))
    return blocks


def create(
    machine: Machine,
    name: str,
    *,
    store: str = "files",
    model: ModelSettings | None = None,
    agent_id: str | None = None,
    owner: str | None = None,
    harness: str = "builtin",
) -> Agent:
    check_name(name)
    if store not in ("files", "sqlite"):
        raise InvalidInput(f"unknown store {store!r}", hint="use --store files or --store sqlite")
    settings_path = machine.settings_file(name)
    folders = machine.folders(name)
    if settings_path.exists() or folders.root.exists():
        raise AlreadyExists(
            f"an agent named {name!r} already exists",
            hint="pick another name, or remove it first: lnk agent remove " + name,
        )
    ms = load_machine(machine)
    settings = Settings(
        id=agent_id or new_agent_id(),
        name=name,
        owner=owner or account_owner(machine) or ms.owner_stand_in,
        harness=harness,
        port_base=ports.allocate(name, harness, taken_blocks(machine)),
        store=store,
        model=model or ModelSettings(),
    )
    # build the folders under a temporary name, then rename: nothing half-made
    machine.agents_root.mkdir(parents=True, exist_ok=True)
    staging = machine.agents_root / f".creating-{name}-{settings.id}"
    try:
        tmp = AgentFolders(staging)
        tmp.make()
        tmp.sandbox_toml.write_text(DEFAULT_SANDBOX_TOML)
        staging.rename(folders.root)
        try:
            save(settings_path, settings)
        except BaseException:
            rmtree(folders.root)
            raise
    finally:
        if staging.exists():
            rmtree(staging)
    return Agent(machine, settings)


def kept_dir(machine: Machine, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return machine.home / "Link" / "Kept" / f"{name}-{stamp}"


def remove(machine: Machine, agent: Agent, *, keep_files: bool) -> Path | None:
    """Delete the agent's settings, state and keys; keep its folders aside or delete them."""
    kept: Path | None = None
    root = agent.folders.root
    if root.exists():
        if keep_files:
            kept = kept_dir(machine, agent.name)
            kept.parent.mkdir(parents=True, exist_ok=True)
            root.rename(kept)
        else:
            if not rmtree(root):
                raise OSError(f"{root} could not be removed wholly")
    rmtree(agent.runtime)
    rmtree(agent.net)
    secrets.remove_all(machine, agent.id)  # its keys go with it
    agent.settings_path.unlink(missing_ok=True)
    return kept


LAST_BACKUP = "backup-last.json"


def last_backup(runtime: Path) -> dict[str, Any] | None:
    """The last backup run's result, as the backup wrote it in the agent's runtime folder."""
    try:
        doc = json.loads((runtime / LAST_BACKUP).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
