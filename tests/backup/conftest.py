"""Backup fixtures: a repository bucket on a local folder and on moto S3."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from backup_helpers import CountingBucket
from servers import MotoServer

from lnk.formats.keys import ReceiverKey
from lnk.transport.buckets import open_bucket


@pytest.fixture(scope="session")
def backup_moto() -> Iterator[MotoServer]:
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture(params=["local", "s3"])
def bucket(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> CountingBucket:
    if request.param == "local":
        root = tmp_path / "repo"
        root.mkdir()
        return CountingBucket(open_bucket(f"file://{root}"))
    server: MotoServer = request.getfixturevalue("backup_moto")
    server.env(monkeypatch)
    name = f"lnk-backup-{secrets.token_hex(6)}"
    server.client().create_bucket(Bucket=name)
    return CountingBucket(open_bucket(f"s3://{name}/backups/ada"))


@pytest.fixture
def owner() -> ReceiverKey:
    return ReceiverKey.generate()
