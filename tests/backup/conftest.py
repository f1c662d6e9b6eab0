"""Backup fixtures: a repository bucket on a local folder and on moto S3; for an agent's
backups, two machines and a fresh bucket on each real backend (a local folder, moto S3,
the GCS emulator, Ceph radosgw: the root conftest's session servers)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from backup_helpers import CountingBucket
from servers import GcsEmulator, MotoServer, RadosGateway

from lnk.agents.layout import Machine
from lnk.formats.keys import ReceiverKey
from lnk.transport.buckets import open_bucket


@pytest.fixture(params=["local", "s3"])
def bucket(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> CountingBucket:
    if request.param == "local":
        root = tmp_path / "repo"
        root.mkdir()
        return CountingBucket(open_bucket(f"file://{root}"))
    server: MotoServer = request.getfixturevalue("moto")
    server.env(monkeypatch)
    name = f"lnk-backup-{secrets.token_hex(6)}"
    server.client().create_bucket(Bucket=name)
    return CountingBucket(open_bucket(f"s3://{name}/backups/ada"))


@pytest.fixture
def owner() -> ReceiverKey:
    return ReceiverKey.generate()


# ---- an agent's backups: two machines, a fresh bucket on each real backend ----
BACKENDS = ["local", "s3", "gcs", "rgw"]


def _name() -> str:
    return f"lnk-bk-{secrets.token_hex(6)}"


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        root = tmp_path / "bucket"
        root.mkdir()
        return f"file://{root}"
    if request.param == "s3":
        moto: MotoServer = request.getfixturevalue("moto")
        moto.env(monkeypatch)
        name = _name()
        moto.client().create_bucket(Bucket=name)
        return f"s3://{name}/agents"
    if request.param == "rgw":
        rgw: RadosGateway = request.getfixturevalue("radosgw")
        rgw.env(monkeypatch)
        name = _name()
        rgw.client().create_bucket(Bucket=name)
        return f"s3://{name}/agents"
    gcs: GcsEmulator = request.getfixturevalue("gcs_emulator")
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


@pytest.fixture
def read_ahead_at_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The second process starts with the run's first small files and reads the others
    (lnk/backup/small_reads.py), a few per request; the count of files it was asked."""
    from lnk.backup import packer, read_ahead, sealer

    monkeypatch.setattr(sealer, "START_AFTER", 0)
    monkeypatch.setattr(packer, "BATCH_ITEMS", 2)
    monkeypatch.setattr(read_ahead, "BATCH_ITEMS", 3)
    asked: list[int] = []
    real = sealer.SealProcess.read

    def read(self: sealer.SealProcess, paths: sealer.Paths) -> object:
        asked.append(len(paths))
        return real(self, paths)

    monkeypatch.setattr(sealer.SealProcess, "read", read)
    return asked
