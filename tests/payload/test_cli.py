"""The three invocations, through the real command line on two machines (HOME folders)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from payload_helpers import (
    EVENTS,
    agent_files,
    cli,
    cli_ok,
    collections_of,
    fill_collections,
    write,
)

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.stores import open_agent_store


def _make(home: Path) -> registry.Agent:
    cli_ok("agent", "create", "work", home=home)
    a = registry.find(Machine(home), "work")
    write(a.folders.home / "docs" / "a.txt", b"alpha\n", 0o640, 1_650_000_000_000_000_000)
    os.link(a.folders.home / "docs" / "a.txt", a.folders.home / "hard.txt")
    write(a.folders.agent / "skills" / "s.md", os.urandom(70_000))
    fill_collections(a)
    return a


def _prepare(home: Path, *extra: str) -> dict[str, str]:
    info = json.loads(
        cli_ok("agent", "state-receive", "--prepare", "--json", *extra, home=home).stdout
    )
    assert info["receiver"].startswith("rcv-") and info["format"] == 4
    return info


def test_prepare_send_receive(tmp_path: Path) -> None:
    ha, hb = tmp_path / "a", tmp_path / "b"
    a = _make(ha)
    info = _prepare(hb)
    key = Machine(hb).receivers_dir / info["receiver"] / "key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    stream = tmp_path / "stream"
    cli_ok(
        "agent", "state-send", "--agent", "work", "--to", info["public_key"], home=ha, stdout=stream
    )
    assert stream.read_bytes().startswith(b"\x89LNK\r\n\x1a\n\x00\x04")
    p = cli_ok("agent", "state-receive", "--receiver", info["receiver"], home=hb, stdin=stream)
    assert b"received work" in p.stderr
    assert not key.exists()
    b = registry.find(Machine(hb), "work")
    assert b.id == a.id
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
    assert (b.folders.home / "hard.txt").stat().st_ino == (
        b.folders.home / "docs" / "a.txt"
    ).stat().st_ino
    assert collections_of(b) == collections_of(a)


def test_grants_dropped_are_named_on_stderr_and_in_json(tmp_path: Path) -> None:
    ha, hb = tmp_path / "a", tmp_path / "b"
    a = _make(ha)
    a.folders.sandbox_toml.write_text(
        '[files]\nread = ["~"]\nwrite = ["."]\n[network]\nmode = "host"\n'
        '[commands]\nallow = ["git", "/bin/sh"]\n'
    )
    stream = tmp_path / "stream"
    info = _prepare(hb)
    cli_ok("agent", "state-send", "--to", info["public_key"], home=ha, stdout=stream)
    p = cli_ok(
        "agent", "state-receive", "--receiver", info["receiver"], "--json", home=hb, stdin=stream
    )
    rep = json.loads(p.stdout)
    assert sorted(rep["dropped_grants"]) == sorted(
        ["--read '~'", "--network-mode host", "--command /bin/sh"]
    )
    err = p.stderr.decode()
    assert "lnk agent allow --read '~' --agent work" in err
    assert "lnk agent allow --network-mode host --agent work" in err
    assert "lnk agent allow --command /bin/sh --agent work" in err
    assert rep["committed"] is True and rep["id"] == a.id


def test_abandon_deletes_the_receiver(tmp_path: Path) -> None:
    hb = tmp_path / "b"
    info = _prepare(hb)
    d = Machine(hb).receivers_dir / info["receiver"]
    assert (d / "key").exists()
    cli_ok("agent", "state-receive", "--receiver", info["receiver"], "--abandon", home=hb)
    assert not d.exists()
    p = cli("agent", "state-receive", "--receiver", info["receiver"], home=hb)
    assert p.returncode == 3 and b"no receiver" in p.stderr


def test_a_damaged_stream_fails_with_its_exit_code(tmp_path: Path) -> None:
    ha, hb = tmp_path / "a", tmp_path / "b"
    _make(ha)
    info = _prepare(hb)
    stream = tmp_path / "stream"
    cli_ok("agent", "state-send", "--to", info["public_key"], home=ha, stdout=stream)
    cut = tmp_path / "cut"
    cut.write_bytes(stream.read_bytes()[:-100])
    p = cli("agent", "state-receive", "--receiver", info["receiver"], home=hb, stdin=cut)
    assert p.returncode == 10, p.stderr
    assert b"lnk: error:" in p.stderr
    assert not (hb / "Link" / "Agents" / "work").exists()


def test_bulk_final_and_inventory(tmp_path: Path) -> None:
    ha, hb = tmp_path / "a", tmp_path / "b"
    a = _make(ha)
    info = _prepare(hb)
    key = Machine(hb).receivers_dir / info["receiver"] / "key"
    bulk, final, inv = tmp_path / "bulk", tmp_path / "final", tmp_path / "inv"
    cli_ok(
        "agent", "state-send", "--to", info["public_key"], "--phase", "bulk", home=ha, stdout=bulk
    )
    p = cli_ok("agent", "state-receive", "--receiver", info["receiver"], home=hb, stdin=bulk)
    assert b"staged (bulk phase)" in p.stderr
    assert key.exists()
    assert not (hb / "Link" / "Agents" / "work").exists()
    # the agent goes on: two more events, one file changes
    s = open_agent_store(a.folders.chats, a.settings.store)
    try:
        assert s.append(EVENTS, 4, {"text": "after the bulk"})
        assert s.append(EVENTS, 5, {"text": "and again"})
    finally:
        s.close()
    write(a.folders.home / "docs" / "new.txt", b"brand new\n")
    cli_ok(
        "agent", "state-receive", "--receiver", info["receiver"], "--inventory", home=hb, stdout=inv
    )
    report = tmp_path / "report.json"
    cli_ok(
        "agent",
        "state-send",
        "--to",
        info["public_key"],
        "--phase",
        "final",
        "--inventory",
        str(inv),
        "--report",
        str(report),
        home=ha,
        stdout=final,
    )
    rep = json.loads(report.read_text())
    assert rep["data_bytes"] == len(b"brand new\n")
    # the log carries only its two new events; the three maps go whole (2 + 1 lines each)
    assert rep["collection_records"] == (2 + 2) + 3 * 3
    p = cli_ok(
        "agent", "state-receive", "--receiver", info["receiver"], "--json", home=hb, stdin=final
    )
    assert json.loads(p.stdout)["committed"] is True
    assert not key.exists()
    b = registry.find(Machine(hb), "work")
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
    assert collections_of(b) == collections_of(a)
    assert len(collections_of(b)["events/link:main"]) == 5 + 2


def test_second_send_with_inventory_through_the_cli(tmp_path: Path) -> None:
    ha, hb = tmp_path / "a", tmp_path / "b"
    a = _make(ha)
    stream = tmp_path / "stream"
    info = _prepare(hb)
    cli_ok("agent", "state-send", "--to", info["public_key"], home=ha, stdout=stream)
    cli_ok("agent", "state-receive", "--receiver", info["receiver"], home=hb, stdin=stream)
    info = _prepare(hb, "--agent-id", a.id)
    assert int(info["holds"]) >= 2
    inv, report = tmp_path / "inv", tmp_path / "report.json"
    cli_ok(
        "agent", "state-receive", "--receiver", info["receiver"], "--inventory", home=hb, stdout=inv
    )
    cli_ok(
        "agent",
        "state-send",
        "--to",
        info["public_key"],
        "--inventory",
        str(inv),
        "--report",
        str(report),
        home=ha,
        stdout=stream,
    )
    assert json.loads(report.read_text())["data_bytes"] == 0
    p = cli_ok(
        "agent", "state-receive", "--receiver", info["receiver"], "--json", home=hb, stdin=stream
    )
    assert json.loads(p.stdout)["data_bytes"] == 0


def test_a_name_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    ha, hb = tmp_path / "a", tmp_path / "b"
    a = _make(ha)
    with open(os.fsencode(str(a.folders.home / "docs")) + b"/r\xe9sum\xe9\x1b[2J.txt", "wb") as f:
        f.write(b"a name from another encoding\n")
    info = _prepare(hb)
    p = cli("agent", "state-send", "--agent", "work", "--to", info["public_key"], home=ha)
    assert p.returncode == 5
    lines = p.stderr.decode().splitlines()
    assert len(lines) == 2 and "Traceback" not in p.stderr.decode()
    assert lines[0].startswith("lnk: error: /")
    assert lines[0].endswith(
        "/Home/docs/r\\xe9sum\\xe9\\x1b[2J.txt: the name is not UTF-8, and lnk carries "
        "UTF-8 names only"
    )
    assert "\x1b" not in p.stderr.decode()  # the terminal escape in the name is not let through
    assert lines[1].startswith("lnk: hint: ls -b -- ")
