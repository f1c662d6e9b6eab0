"""One conformance suite, unchanged for every backend: a local folder, moto S3,
the GCS emulator and Ceph radosgw (S3 on a one-node memstore cluster)."""

from __future__ import annotations

import hashlib
import os

import pytest

from lnk.errors import InvalidInput, NotFound, UsageError
from lnk.transport.buckets import Bucket, open_bucket


def test_put_get_exists(any_bucket: Bucket) -> None:
    assert not any_bucket.exists("a/b.txt")
    any_bucket.put("a/b.txt", b"hello")
    assert any_bucket.exists("a/b.txt")
    assert any_bucket.get("a/b.txt") == b"hello"
    assert sorted(any_bucket.list()) == [("a/b.txt", 5)]


def test_empty_object(any_bucket: Bucket) -> None:
    any_bucket.put("empty", b"")
    assert any_bucket.get("empty") == b""
    assert list(any_bucket.list()) == [("empty", 0)]


def test_overwrite(any_bucket: Bucket) -> None:
    any_bucket.put("k", b"one")
    any_bucket.put("k", b"second")
    assert any_bucket.get("k") == b"second"
    assert list(any_bucket.list()) == [("k", 6)]


def test_delete_and_idempotent_delete(any_bucket: Bucket) -> None:
    any_bucket.put("x/y", b"1")
    any_bucket.delete("x/y")
    assert not any_bucket.exists("x/y")
    assert list(any_bucket.list()) == []
    any_bucket.delete("x/y")  # a missing key is not an error
    with pytest.raises(NotFound):
        any_bucket.get("x/y")


def test_ranged_reads(any_bucket: Bucket) -> None:
    body = bytes(range(256)) * 40  # 10,240 bytes
    any_bucket.put("data/p", body)
    assert any_bucket.get_range("data/p", 0, 8) == body[:8]
    assert any_bucket.get_range("data/p", 1000, 3000) == body[1000:4000]
    assert any_bucket.get_range("data/p", 10_000, 1 << 20) == body[10_000:]  # short at the end
    assert any_bucket.get_range("data/p", 10_239, 1) == body[-1:]
    assert any_bucket.get_range("data/p", 10_240, 16) == b""  # past the end: nothing
    assert any_bucket.get_range("data/p", 50_000, 16) == b""
    assert any_bucket.get_range("data/p", 5, 0) == b""
    with pytest.raises(NotFound):
        any_bucket.get_range("data/none", 0, 16)
    with pytest.raises(NotFound):
        any_bucket.get_range("data/none", 50_000, 16)


def test_get_missing_is_not_found(any_bucket: Bucket) -> None:
    with pytest.raises(NotFound) as err:
        any_bucket.get("nope/nothing")
    assert "nope/nothing" in err.value.message


def test_prefix_listing(any_bucket: Bucket) -> None:
    for key in ("data/aa/1", "data/aa/2", "data/ab/3", "index/1", "dataset"):
        any_bucket.put(key, key.encode())
    assert sorted(k for k, _ in any_bucket.list("data/")) == ["data/aa/1", "data/aa/2", "data/ab/3"]
    assert sorted(k for k, _ in any_bucket.list("data/a")) == [
        "data/aa/1",
        "data/aa/2",
        "data/ab/3",
    ]
    assert sorted(k for k, _ in any_bucket.list("data")) == [
        "data/aa/1",
        "data/aa/2",
        "data/ab/3",
        "dataset",
    ]
    assert sorted(k for k, _ in any_bucket.list("index/")) == ["index/1"]
    assert list(any_bucket.list("zzz")) == []
    sizes = dict(any_bucket.list())
    assert sizes["data/aa/1"] == len(b"data/aa/1")


def test_listing_a_few_hundred(any_bucket: Bucket) -> None:
    keys = {f"many/{i:04d}": i % 7 for i in range(300)}
    for key, n in keys.items():
        any_bucket.put(key, b"z" * n)
    listed = dict(any_bucket.list("many/"))
    assert listed == keys
    infos = list(any_bucket.entries("many/"))
    assert len(infos) == 300
    assert all(info.modified.tzinfo is not None for info in infos)


def test_big_object_20_mib(any_bucket: Bucket) -> None:
    data = os.urandom(20 * 1024 * 1024)
    any_bucket.put("big", data)
    assert dict(any_bucket.list()) == {"big": len(data)}
    got = any_bucket.get("big")
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def test_labels_set_read_merge(any_bucket: Bucket) -> None:
    assert "lnk-layout" not in any_bucket.labels()
    any_bucket.set_label("owner", "ada")
    any_bucket.set_label("lnk-layout", "1")
    any_bucket.set_label("lnk-layout", "2")
    labels = any_bucket.labels()
    assert labels["lnk-layout"] == "2"
    assert labels["owner"] == "ada"  # merged, not dropped


def test_bad_label_and_key_are_invalid_input(any_bucket: Bucket) -> None:
    with pytest.raises(InvalidInput):
        any_bucket.set_label("Bad Name", "x")
    with pytest.raises(InvalidInput):
        any_bucket.put("../escape", b"x")
    with pytest.raises(InvalidInput):
        any_bucket.get("a//b")


def test_prefix_isolation(any_bucket: Bucket) -> None:
    """Keys stay under the URL's prefix: a sibling prefix does not see them."""
    any_bucket.put("mine", b"1")
    url = any_bucket.describe()
    if url.startswith("file://"):
        return_sibling = open_bucket(url + "-other")
        with pytest.raises(NotFound):
            list(return_sibling.list())
    else:
        sibling = open_bucket(url.rsplit("/", 1)[0] + "/other")
        assert list(sibling.list()) == []
        assert not sibling.exists("mine")
    assert any_bucket.exists("mine")


def test_describe_names_the_url(any_bucket: Bucket) -> None:
    assert any_bucket.describe().split("://")[0] in ("s3", "gs", "file")
    assert any_bucket.describe() in repr(any_bucket)


@pytest.mark.parametrize("backend", ["local", "s3", "gcs", "rgw"])
def test_missing_bucket_is_not_found(backend: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(f"{backend}_url")
    scheme, rest = url.split("://", 1)
    if scheme == "file":
        missing = open_bucket(f"file://{rest}/does-not-exist")
    else:
        missing = open_bucket(f"{scheme}://lnk-no-such-bucket-{os.getpid()}/p")
    with pytest.raises(NotFound):
        missing.get("k")
    with pytest.raises(NotFound):
        missing.exists("k")
    with pytest.raises(NotFound):
        list(missing.list())


@pytest.mark.parametrize(
    "url", ["http://x/y", "s3:///nobucket", "file://relative/path", "ftp://h/p", "/abs/path"]
)
def test_open_bucket_rejects_other_forms(url: str) -> None:
    with pytest.raises(UsageError) as err:
        open_bucket(url)
    assert (err.value.hint is not None and "s3://" in err.value.hint) or "file:///" in (
        err.value.hint or ""
    )


def test_open_bucket_parses_prefixes() -> None:
    from lnk.transport.buckets.gcs import GCSBucket
    from lnk.transport.buckets.local import LocalBucket
    from lnk.transport.buckets.s3 import S3Bucket

    s3 = open_bucket("s3://bkt/a/b/")
    assert isinstance(s3, S3Bucket) and (s3.bucket, s3.prefix) == ("bkt", "a/b")
    gs = open_bucket("gs://bkt")
    assert isinstance(gs, GCSBucket) and (gs.bucket, gs.prefix) == ("bkt", "")
    loc = open_bucket("file:///tmp/x%20y")
    assert isinstance(loc, LocalBucket) and str(loc.root) == "/tmp/x y"
