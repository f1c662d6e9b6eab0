"""Agent backup fixtures: two machines, and a fresh bucket on each real backend
(a local folder, moto S3, the GCS emulator, Ceph radosgw)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import GcsEmulator, MotoServer, RadosGateway

from lnk.agents.layout import Machine

BACKENDS = ["local", "s3", "gcs", "rgw"]


@pytest.fixture(scope="session")
def bk_moto() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def bk_gcs() -> Iterator[GcsEmulator]:
    server = GcsEmulator()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def bk_rgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RadosGateway]:
    server = RadosGateway(str(tmp_path_factory.mktemp("ceph")))
    yield server
    server.stop()


def _name() -> str:
    return f"lnk-bk-{secrets.token_hex(6)}"


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        root = tmp_path / "bucket"
        root.mkdir()
        return f"file://{root}"
    if request.param == "s3":
        moto: MotoServer = request.getfixturevalue("bk_moto")
        moto.env(monkeypatch)
        name = _name()
        moto.client().create_bucket(Bucket=name)
        return f"s3://{name}/agents"
    if request.param == "rgw":
        rgw: RadosGateway = request.getfixturevalue("bk_rgw")
        rgw.env(monkeypatch)
        name = _name()
        rgw.client().create_bucket(Bucket=name)
        return f"s3://{name}/agents"
    gcs: GcsEmulator = request.getfixturevalue("bk_gcs")
    gcs.env(monkeypatch)
    name = _name()
    gcs.client().create_bucket(name)
    return f"gs://{name}/agents"


@pytest.fixture
def local_url(tmp_path: Path) -> str:
    root = tmp_path / "lbucket"
    root.mkdir()
    return f"file://{root}"


@pytest.fixture
def src(home: Path) -> Machine:
    """The machine the agent lives on (the test's HOME)."""
    return Machine(home)


@pytest.fixture
def dst(tmp_path: Path) -> Machine:
    """Another machine, to restore on."""
    return Machine(tmp_path / "other")
