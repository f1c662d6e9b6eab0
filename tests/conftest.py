"""Hermetic tests: every test gets a fresh HOME and no LNK_* variables.

The real servers the tests run (SSH hosts, moto S3, the GCS emulator, Ceph
radosgw) are session fixtures here, shared by every folder: each starts once
per test process (with pytest-xdist, once per worker; the heavy ones are
grouped on one worker, see ``pytest_collection_modifyitems``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts import Hosts, reset_homes, running_hosts
from servers import GcsEmulator, MotoServer, RadosGateway

# a provider's key in the shell running the tests would make new agents think with it
PROVIDER_KEYS = ("OPENAI_API_KEY", "GEMINI_API_KEY", "OPENROUTER_API_KEY")


_SCANDIR = os.scandir  # as it is: a test may patch os.scandir until its monkeypatch undoes it


def _stop_leftovers(home: Path) -> None:
    """After a test: any lnk runner, harness or bridge still running for its HOME is killed, so
    one failed test's agent never holds a port the next test's agent needs."""
    mine = str(home).encode()
    for entry in _SCANDIR("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = Path(entry.path, "cmdline").read_bytes()
            if b"lnk" not in cmd:
                continue
            env = Path(entry.path, "environ").read_bytes().split(b"\0")
            if mine + b"/" in cmd or b"HOME=" + mine in env:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


@pytest.fixture(autouse=True)
def _hermetic_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    for name in list(os.environ):
        if name.startswith("LNK_") or name in PROVIDER_KEYS:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LNK_TESTING", "1")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # each worker's agents: own ports
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    monkeypatch.setenv("LNK_TEST_PORT_OFFSET", str(2000 * (index % 4)))
    yield home
    _stop_leftovers(home)


@pytest.fixture
def home(_hermetic_home: Path) -> Path:
    return _hermetic_home


# ---- the real servers, once per test process ------------------------------------------
@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    server = GcsEmulator()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def radosgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RadosGateway]:
    server = RadosGateway(str(tmp_path_factory.mktemp("ceph")))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _ssh_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    with running_hosts(tmp_path_factory.mktemp("hosts")) as hosts:
        yield hosts


@pytest.fixture
def ssh_hosts(_ssh_hosts: Hosts) -> Iterator[Hosts]:
    """The session's SSH hosts, each as it was made when the test ends (its HOME emptied)."""
    try:
        yield _ssh_hosts
    finally:
        reset_homes(_ssh_hosts)


@pytest.fixture
def ssh_env(ssh_hosts: Hosts, monkeypatch: pytest.MonkeyPatch, home: Path) -> Hosts:
    """LNK_SSH_COMMAND pointing at the test hosts' ssh_config, in this process."""
    monkeypatch.setenv("LNK_SSH_COMMAND", ssh_hosts.ssh_command)
    return ssh_hosts


@pytest.fixture
def cli_env(ssh_env: Hosts, home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["HOME"] = str(home)
    env["LNK_SSH_COMMAND"] = ssh_env.ssh_command
    return env


HEAVY = {"radosgw": "rgw", "_ssh_hosts": "ssh"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With pytest-xdist (--dist loadgroup), every test of a heavy server runs on one worker,
    so radosgw and the SSH hosts start once per run."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(item, "callspec", None)
        if params is not None and "rgw" in params.params.values():
            names.add("radosgw")
        if params is not None and "ssh" in params.params.values():
            names.add("_ssh_hosts")
        for fixture, group in HEAVY.items():
            if fixture in names:
                item.add_marker(pytest.mark.xdist_group(group))
                break
