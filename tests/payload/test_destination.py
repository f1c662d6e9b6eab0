"""What a receive may do to the machine it lands on: grants, clashes, coming back."""

from __future__ import annotations

import subprocess

import pytest
from payload_helpers import (
    agent_files,
    collections_of,
    fill_collections,
    load_agent,
    machine_tree,
    make_agent,
    move,
    prepare,
    receive_bytes,
    sample_agent,
    send_bytes,
    write,
)

from lnk.agents import grants
from lnk.agents.layout import Machine
from lnk.errors import AlreadyExists, Refused

WIDE_GRANTS = """\
[files]
read = ["~", "/etc", "../up", "projects"]
write = ["."]
[network]
mode = "host"
[internet]
hosts = ["*"]
[lan]
hosts = ["192.168.1.5"]
[ports]
allow = [8080]
[browser]
host = "10.0.0.2"
[tcp]
endpoints = ["github.com:22"]
[tools]
outside = ["docker"]
[commands]
allow = ["git", "/usr/bin/curl", "*", "py*"]
[mystery]
x = 1
"""

DROPPED = [
    "--read '~'",
    "--read '/etc'",
    "--read '../up'",
    "--network-mode host",
    "--lan-host 192.168.1.5",
    "--port 8080",
    "--browser-host 10.0.0.2",
    "--tcp github.com:22",
    "--tool docker",
    "--command /usr/bin/curl",
    "--command *",
    "--command py*",
    "[mystery] (not a section this lnk knows)",
]


def test_wide_grants_are_dropped_and_named(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    a.folders.sandbox_toml.write_text(WIDE_GRANTS)
    _, rrep = move(a, dst)
    assert sorted(rrep.dropped_grants) == sorted(DROPPED)
    got = grants.parse(load_agent(dst).folders.sandbox_toml.read_text())
    assert got == {
        "files": {"read": ["projects"], "write": ["."]},
        "internet": {"hosts": ["*"]},
        "commands": {"allow": ["git"]},
    }


def test_an_agent_coming_back_keeps_this_machines_grants(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    move(a, dst)
    here = '[files]\nwrite = ["."]\n[ports]\nallow = [9000]\n'
    load_agent(dst).folders.sandbox_toml.write_text(here)
    a.folders.sandbox_toml.write_text(WIDE_GRANTS)
    _, rrep = move(a, dst, agent_id=a.id, inventory=True)
    assert rrep.dropped_grants == []
    assert load_agent(dst).folders.sandbox_toml.read_text() == here


def test_another_agent_of_the_same_name_is_refused(src: Machine, dst: Machine) -> None:
    a = sample_agent(src)
    other = make_agent(dst)  # "work" too, another ID
    write(other.folders.home / "theirs.txt", b"theirs")
    r = prepare(dst)
    before = machine_tree(dst)
    data, _ = send_bytes(a, r)
    with pytest.raises(AlreadyExists, match="another agent"):
        receive_bytes(dst, r, data)
    assert machine_tree(dst) == before


def test_a_folder_without_settings_is_in_the_way(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    write(dst.folders("work").home / "stray.txt", b"stray")
    r = prepare(dst)
    before = machine_tree(dst)
    data, _ = send_bytes(a, r)
    with pytest.raises(AlreadyExists):
        receive_bytes(dst, r, data)
    assert machine_tree(dst) == before


def test_coming_back_replaces_agent_state_and_adds_to_home(src: Machine, dst: Machine) -> None:
    a = sample_agent(src)
    write(a.folders.home / "both.txt", b"old both")
    move(a, dst)
    b = load_agent(dst)
    port_base = b.settings.port_base
    write(b.folders.agent / "memory" / "only-old.md", b"forget me")
    write(b.folders.home / "only-here.txt", b"stay")
    write(a.folders.home / "both.txt", b"new both from the source")
    fill_collections(a, events=2)
    _, rrep = move(a, dst, agent_id=a.id, inventory=True)
    assert rrep.committed
    b = load_agent(dst)
    assert not (b.folders.agent / "memory" / "only-old.md").exists()
    assert (b.folders.home / "only-here.txt").read_bytes() == b"stay"
    assert (b.folders.home / "both.txt").read_bytes() == b"new both from the source"
    want = agent_files(a.folders.root)
    got = agent_files(b.folders.root)
    del got["Home/only-here.txt"]
    assert got == want
    assert collections_of(b) == collections_of(a)
    assert b.settings.port_base == port_base  # this machine's ports stay


def test_collections_not_in_the_stream_are_gone_after_coming_back(
    src: Machine, dst: Machine
) -> None:
    from lnk.agents.stores import open_agent_store
    from lnk.collections import CollectionId

    a = sample_agent(src)
    move(a, dst)
    b = load_agent(dst)
    s = open_agent_store(b.folders.chats, b.settings.store)
    s.append(CollectionId("events", "link:stale"), 1, {"text": "only here"})
    s.close()
    move(a, dst, agent_id=a.id, inventory=True)
    assert collections_of(load_agent(dst)) == collections_of(a)


def test_a_running_agent_at_the_destination_refuses(src: Machine, dst: Machine) -> None:
    a = sample_agent(src)
    move(a, dst)
    b = load_agent(dst)
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        b.runtime.mkdir(parents=True, exist_ok=True)
        (b.runtime / "runner.pid").write_text(str(sleeper.pid))
        r = prepare(dst, a.id)
        before = machine_tree(dst)
        data, _ = send_bytes(a, r)
        with pytest.raises(Refused, match="running here"):
            receive_bytes(dst, r, data)
        assert machine_tree(dst) == before
    finally:
        sleeper.kill()
        sleeper.wait()


def test_same_id_under_another_name_is_refused(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    make_agent(dst, "other", agent_id=a.id, owner=a.settings.owner)
    r = prepare(dst)
    before = machine_tree(dst)
    data, _ = send_bytes(a, r)
    with pytest.raises(AlreadyExists, match="lives here as 'other'"):
        receive_bytes(dst, r, data)
    assert machine_tree(dst) == before


def test_an_account_agent_needs_that_account(src: Machine, dst: Machine) -> None:
    a = make_agent(src, owner="acct-someone")
    r = prepare(dst)
    before = machine_tree(dst)
    data, _ = send_bytes(a, r)
    with pytest.raises(Refused, match="acct-someone"):
        receive_bytes(dst, r, data)
    assert machine_tree(dst) == before
