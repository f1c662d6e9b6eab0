"""Fixtures for the legs' tests: each implementation of a leg, over the session's real sshd
hosts (tests/hosts.py, the root conftest's ``ssh_hosts``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hosts import Hosts

from lnk.transport.legs import Leg, LocalLeg, SshLeg


@pytest.fixture(params=["local", "ssh"])
def leg(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Leg, Path]:
    """Each implementation of a leg, with the HOME it runs in."""
    if request.param == "local":
        other = tmp_path / "other-home"
        return LocalLeg(other), other
    hosts: Hosts = request.getfixturevalue("ssh_env")
    return SshLeg("hostA"), hosts["hostA"].home
