"""Bucket fixtures: one real server of each kind per test session, a fresh
bucket per test, and ``any_bucket`` parametrised over every backend."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from servers import GcsEmulator, MotoServer, RadosGateway

from lnk.transport.buckets import Bucket, open_bucket

BACKENDS = ["local", "s3", "gcs", "rgw"]


def new_bucket_name() -> str:
    return f"lnk-test-{secrets.token_hex(6)}"


@pytest.fixture
def s3_url(moto: MotoServer, monkeypatch: pytest.MonkeyPatch) -> str:
    moto.env(monkeypatch)
    name = new_bucket_name()
    moto.client().create_bucket(Bucket=name)
    return f"s3://{name}/some/prefix"


@pytest.fixture
def rgw_url(radosgw: RadosGateway, monkeypatch: pytest.MonkeyPatch) -> str:
    radosgw.env(monkeypatch)
    name = new_bucket_name()
    radosgw.client().create_bucket(Bucket=name)
    return f"s3://{name}/some/prefix"


@pytest.fixture
def gcs_url(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    gcs_emulator.env(monkeypatch)
    name = new_bucket_name()
    gcs_emulator.client().create_bucket(name)
    return f"gs://{name}/some/prefix"


@pytest.fixture
def local_url(tmp_path: Path) -> str:
    root = tmp_path / "bucket"
    root.mkdir()
    return f"file://{root}"


@pytest.fixture(params=BACKENDS)
def any_bucket(request: pytest.FixtureRequest) -> Bucket:
    url = request.getfixturevalue(f"{request.param}_url")
    return open_bucket(url)
