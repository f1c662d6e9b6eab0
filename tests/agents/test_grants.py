"""A stream never widens what an agent may do on the machine receiving it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from lnk.agents import grants as g
from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.policy import filter_from_stream
from lnk.errors import InvalidInput
from tests.lnkrun import lnk

WIDE = """
[files]
read = ["~", "/etc", "work", "../escape"]
write = ["work", "~/Documents"]
[network]
mode = "host"
[internet]
hosts = ["api.example.com"]
[lan]
hosts = ["nas.local"]
[ports]
allow = [5432]
[browser]
host = "127.0.0.1:9222"
[tcp]
endpoints = ["github.com:22"]
[tools]
outside = ["shell"]
[commands]
allow = ["git", "/usr/bin/curl", "*"]
[harness]
grant = "everything"
"""


def test_wide_grants_are_dropped_and_named() -> None:
    f = filter_from_stream(WIDE)
    assert f.grants == {
        "files": {"read": ["work"], "write": ["work"]},
        "internet": {"hosts": ["api.example.com"]},
        "commands": {"allow": ["git"]},
    }
    for flag in (
        "--read '~'",
        "--read '/etc'",
        "--read '../escape'",
        "--write '~/Documents'",
        "--network-mode host",
        "--lan-host nas.local",
        "--port 5432",
        "--browser-host 127.0.0.1:9222",
        "--tcp github.com:22",
        "--tool shell",
        "--command /usr/bin/curl",
        "--command *",
        "[harness]",
    ):
        assert any(d.startswith(flag) for d in f.dropped), flag
    # what is kept is valid TOML that reads back the same
    assert tomllib.loads(f.to_toml()) == f.grants


def test_narrow_grants_pass_unchanged() -> None:
    f = filter_from_stream('[files]\nwrite = ["."]\n[internet]\nhosts = ["*"]\n')
    assert f.dropped == []
    assert f.grants == {"files": {"write": ["."]}, "internet": {"hosts": ["*"]}}


def test_garbage_and_oversized_grants_are_refused() -> None:
    with pytest.raises(InvalidInput, match="not valid TOML"):
        filter_from_stream("[[[")
    with pytest.raises(InvalidInput, match="larger than"):
        filter_from_stream("# " + "x" * 70000)


def test_limits_are_set_by_allow_shown_and_never_taken_from_a_stream(home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    r = lnk("agent", "allow", "--memory", "512M", "--processes", "64", "--open-files", "256")
    assert r.code == 0, r.err
    spec = g.read_spec(a.folders.sandbox_toml)
    assert (spec.memory, spec.processes, spec.files) == ("512M", 64, 256)
    shown = lnk("agent", "show", "--permissions", "--json").json()
    assert shown["limits"][0] == "open files 256"
    assert "--memory 512M" in shown["flags"]
    for bad in (
        ("--memory", "12"),
        ("--memory", "lots"),
        ("--processes", "0"),
        ("--open-files", "-1"),
    ):
        q = lnk("agent", "allow", *bad)
        assert q.code != 0 and q.err.startswith("lnk: error: ") and "Traceback" not in q.err, q.err
    assert lnk("agent", "deny", "--memory", "512M").code == 0
    assert g.read_spec(a.folders.sandbox_toml).memory == ""
    kept = filter_from_stream('[limits]\nmemory = "1T"\nprocesses = 100000\n')
    assert "limits" not in kept.grants
    assert kept.dropped == ["--memory 1T", "--processes 100000"]
    hand = a.folders.sandbox_toml
    hand.write_text('[limits]\nprocesses = "many"\n')
    q = lnk("agent", "start")
    assert q.code != 0 and "[limits] processes" in q.err and "Traceback" not in q.err


def test_allow_and_deny_keep_a_person_s_comments(home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    f = a.folders.sandbox_toml
    f.write_text(
        "# my notes on this agent: keep them\n[files]\n"
        'write = ["."]  # its Home\n\n# the internet, as I want it\n[internet]\nhosts = ["*"]\n'
    )
    assert lnk("agent", "deny", "--host", "evil.example").code == 0
    assert lnk("agent", "allow", "--port", "8080", "--memory", "1G").code == 0
    assert lnk("agent", "deny", "--port", "8080").code == 0
    text = f.read_text()
    for comment in (
        "# my notes on this agent: keep them",
        "# its Home",
        "# the internet, as I want it",
    ):
        assert comment in text, text
    spec = g.read_spec(f)
    assert spec.hosts == ["*", "!evil.example"] and spec.ports == [] and spec.memory == "1G"


def test_the_readme_s_folders_are_granted_on_a_new_agent_or_the_hint_makes_them(home: Path) -> None:
    registry.create(Machine.current(), "main")
    r = lnk("agent", "allow", "--read", "~/Documents", "--write", "~/out")
    assert r.code == 6 and "does not exist" in r.err, r.err
    hint = next(ln for ln in r.err.splitlines() if ln.startswith("lnk: hint: "))
    assert hint == f"lnk: hint: make the folder first, then grant it: mkdir -p {home}/Documents"
    (home / "Documents").mkdir()
    (home / "out").mkdir()
    assert lnk("agent", "allow", "--read", "~/Documents", "--write", "~/out").code == 0
