"""Fixtures for the SSH tests: real sshd hosts (see tests/hosts.py) and legs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts import Hosts, running_hosts

from lnk.transport.legs import Leg, LocalLeg, SshLeg


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    with running_hosts(tmp_path_factory.mktemp("hosts")) as hosts:
        yield hosts


@pytest.fixture
def ssh_env(ssh_hosts: Hosts, monkeypatch: pytest.MonkeyPatch, home: Path) -> Hosts:
    """LNK_SSH_COMMAND pointing at the test hosts' ssh_config, in this process."""
    monkeypatch.setenv("LNK_SSH_COMMAND", ssh_hosts.ssh_command)
    return ssh_hosts


@pytest.fixture(params=["local", "ssh"])
def leg(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Leg, Path]:
    """Each implementation of a leg, with the HOME it runs in."""
    if request.param == "local":
        other = tmp_path / "other-home"
        return LocalLeg(other), other
    hosts: Hosts = request.getfixturevalue("ssh_env")
    return SshLeg("hostA"), hosts["hostA"].home


@pytest.fixture
def cli_env(ssh_env: Hosts, home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(home)
    env["LNK_SSH_COMMAND"] = ssh_env.ssh_command
    return env
