"""A stream never widens what an agent may do on the machine receiving it."""

from __future__ import annotations

import tomllib

import pytest

from lnk.agents.grants import filter_from_stream
from lnk.errors import InvalidInput

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
