"""Agents on one machine: identity, names, settings, layout, ports."""

from __future__ import annotations

import socket
import tomllib
from pathlib import Path

import pytest

from lnk.agents import ports, registry, settings
from lnk.agents.layout import Machine
from lnk.errors import AlreadyExists, InvalidInput, NotFound, PortsUnavailable, UsageError
from tests.lnkrun import lnk, ok


def test_create_prints_id_and_lays_out_folders(home: Path) -> None:
    r = ok("agent", "create", "work")
    agent_id = r.out.strip()
    assert settings.ID_RE.match(agent_id)
    root = home / "Link" / "Agents" / "work"
    for sub in (
        "Home",
        "Agent/instructions",
        "Agent/skills",
        "Agent/memory",
        "Agent/chats",
        "Agent/schedule",
        "Config/sandbox.toml",
    ):
        assert (root / sub).exists(), sub
    data = tomllib.loads((home / ".config/lnk/agents/work.toml").read_text())
    assert data["id"] == agent_id and data["format"] == settings.SETTINGS_FORMAT
    assert data["owner"].startswith("local-m-")
    assert (home / ".config/lnk/agents/work.toml").stat().st_mode & 0o077 == 0


def test_ids_are_unique_and_owner_is_the_machine_stand_in(home: Path) -> None:
    m = Machine(home)
    ids = {registry.create(m, f"a{i}").id for i in range(20)}
    assert len(ids) == 20
    owners = {a.settings.owner for a in registry.list_agents(m)}
    assert len(owners) == 1


def test_list_json_and_status_json(home: Path) -> None:
    ok("agent", "create", "work")
    rows = ok("agent", "list", "--json").json()["agents"]
    assert [r["name"] for r in rows] == ["work"]
    st = ok("agent", "status", "--json").json()  # --agent left out: there is one agent
    for key in ("name", "id", "owner", "running", "endpoint", "sandboxed"):
        assert key in st
    assert st["running"] is False and st["sandboxed"] is True
    assert st["endpoint"].startswith("http://127.0.0.1:")


@pytest.mark.parametrize(
    "bad",
    ["a/b", "..", "a..b", "with space", "tab\there", "nl\nx", "", "-dash", ".hidden", "x" * 64],
)
def test_bad_names_are_refused_and_nothing_is_made(home: Path, bad: str) -> None:
    r = lnk("agent", "create", "--", bad)
    assert r.code == InvalidInput.exit_code, r.err
    assert "not a valid agent name" in r.err and "lnk: hint:" in r.err
    assert not (home / "Link" / "Agents").exists() or not any((home / "Link/Agents").iterdir())


def test_duplicate_name(home: Path) -> None:
    ok("agent", "create", "work")
    r = lnk("agent", "create", "work")
    assert r.code == AlreadyExists.exit_code
    assert "already exists" in r.err


def test_agent_option_needed_when_many(home: Path) -> None:
    ok("agent", "create", "one")
    ok("agent", "create", "two")
    r = lnk("agent", "status")
    assert r.code == UsageError.exit_code and "--agent" in r.err
    assert ok("agent", "status", "--agent", "two", "--json").json()["name"] == "two"


def test_unknown_agent(home: Path) -> None:
    ok("agent", "create", "one")
    r = lnk("agent", "status", "--agent", "nope")
    assert r.code == NotFound.exit_code and "nope" in r.err


def test_settings_edited_into_nonsense(home: Path) -> None:
    ok("agent", "create", "work")
    path = home / ".config/lnk/agents/work.toml"
    path.write_text("this is = = not toml")
    r = lnk("agent", "status")
    assert r.code == InvalidInput.exit_code and "not valid TOML" in r.err
    path.write_text('format = 2\nid = "nope"\nname = "work"\nowner = "local-x"\nsandbox = true\n')
    r = lnk("agent", "status")
    assert r.code == InvalidInput.exit_code and "invalid id" in r.err


def test_older_settings_migrate_and_id_is_read_from_file_alone(home: Path) -> None:
    m = Machine(home)
    path = m.settings_file("old")
    path.parent.mkdir(parents=True)
    path.write_text('name = "old"\nowner = "local-abc"\nno_sandbox = true\nport = 20400\n')
    # before loading, an agent from before IDs is keyed by its name
    assert settings.read_agent_key(path) == "old"
    m.folders("old").make()
    a = registry.find(m, "old")
    assert a.settings.sandbox is False and a.settings.port_base == 20400
    data = tomllib.loads(path.read_text())
    assert data["format"] == settings.SETTINGS_FORMAT and data["id"] == a.id
    assert settings.read_agent_key(path) == a.id
    assert a.settings.service_name == f"lnk-agent-{a.id}"


def test_newer_settings_are_refused(home: Path) -> None:
    m = Machine(home)
    path = m.settings_file("new")
    path.parent.mkdir(parents=True)
    path.write_text('format = 99\nname = "new"\n')
    with pytest.raises(InvalidInput, match="newer lnk"):
        registry.find(m, "new")


def test_reserved_service_names() -> None:
    for bad in ("link.agent.x", "lnk-agent-x", "lnk-bridge"):
        with pytest.raises(InvalidInput, match="reserved"):
            settings.check_service_name(bad)
    assert settings.check_service_name("my-helper") == "my-helper"


def test_create_is_atomic_when_settings_cannot_be_written(home: Path) -> None:
    m = Machine(home)
    m.config_dir.mkdir(parents=True)
    m.settings_dir.write_text("a file where a folder should be")
    with pytest.raises(OSError):
        registry.create(m, "work")
    assert not m.folders("work").root.exists()
    assert not any(p.name.startswith(".creating") for p in m.agents_root.iterdir())


def test_main_keeps_default_ports_others_from_20000(home: Path) -> None:
    m = Machine(home)
    main = registry.create(m, "main")
    assert main.settings.port_base == ports.default_base("builtin")
    a = registry.create(m, "a")
    b = registry.create(m, "b")
    assert a.settings.port_base >= ports.first()
    assert b.settings.port_base >= a.settings.port_base + ports.BLOCK


def test_allocation_skips_ports_held_by_a_program(home: Path) -> None:
    held = socket.socket()
    for port in range(ports.first(), ports.first() + 400, ports.BLOCK):
        try:
            held.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    held.listen()
    try:
        # everything below the held block counts as other agents' blocks
        taken = [(ports.first(), port - ports.first())] if port > ports.first() else []
        base = ports.allocate("x", "builtin", taken)
        assert base == port + ports.BLOCK
        assert not ports.block_free(port, ports.BLOCK)
    finally:
        held.close()
    assert ports.allocate("x", "builtin", taken) == port


def test_every_block_taken() -> None:
    taken = [(0, ports.LIMIT)]
    with pytest.raises(PortsUnavailable, match="no free block"):
        ports.allocate("x", "builtin", taken)
    with pytest.raises(PortsUnavailable):
        ports.random_free_block(taken, tries=5)


def test_remove_keeps_files_aside_or_deletes(home: Path) -> None:
    ok("agent", "create", "keepme")
    (home / "Link/Agents/keepme/Home/note.txt").write_text("mine")
    r = lnk("agent", "remove", "keepme")  # no terminal, no --yes
    assert r.code == UsageError.exit_code and "--yes" in r.err
    ok("agent", "remove", "keepme", "--yes")
    assert not (home / ".config/lnk/agents/keepme.toml").exists()
    kept = list((home / "Link/Kept").iterdir())
    assert len(kept) == 1 and (kept[0] / "Home/note.txt").read_text() == "mine"
    ok("agent", "create", "gone")
    ok("agent", "remove", "gone", "--yes", "--files", "delete")
    assert not (home / "Link/Agents/gone").exists()
    assert len(list((home / "Link/Kept").iterdir())) == 1
