"""An object-only key (the key a box gets) reaches objects, never labels.

Uses its own moto_server, since IAM enforcement is server-wide."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from servers import MotoServer

from lnk.errors import Refused
from lnk.transport.buckets import open_bucket

BUCKET = "lnk-box-bucket"
OTHER = "lnk-other-bucket"

OBJECT_ONLY_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Action": [
                "s3:GetObject",
                "s3:PutObject",
                "s3:DeleteObject",
                "s3:ListBucket",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
            "Resource": [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"],
        }
    ],
}
ADMIN_POLICY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["*"]}],
}


@pytest.fixture(scope="module")
def enforcing(moto: MotoServer) -> Iterator[tuple[MotoServer, dict[str, str], dict[str, str]]]:
    """The session's moto, its IAM enforced for this module's tests alone."""
    server = moto
    try:
        s3 = server.client()
        s3.create_bucket(Bucket=BUCKET)
        s3.create_bucket(Bucket=OTHER)
        iam = server.client("iam")
        keys = {}
        for user, policy in (("box", OBJECT_ONLY_POLICY), ("admin", ADMIN_POLICY)):
            user = f"restricted-{user}"  # one moto for the run: names of this module's own
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=json.dumps(policy))
            k = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = {"key": k["AccessKeyId"], "secret": k["SecretAccessKey"]}
        server.set_auth(True)
        yield server, keys["restricted-box"], keys["restricted-admin"]
    finally:
        server.set_auth(False)


def test_object_key_reaches_objects_but_not_labels(
    enforcing: tuple[MotoServer, dict[str, str], dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, box, admin = enforcing
    server.env(monkeypatch, box["key"], box["secret"])
    # No prefix: moto (5.2) miscomputes the signature of a listing whose
    # prefix holds a '/', a moto bug that real S3 does not have.
    b = open_bucket(f"s3://{BUCKET}")
    data = os.urandom(6 * 1024 * 1024)
    b.put("obj", data)
    assert b.get("obj") == data
    assert b.exists("obj")
    assert dict(b.list()) == {"obj": len(data)}
    b.delete("obj")
    assert not b.exists("obj")

    with pytest.raises(Refused) as err:
        b.labels()
    assert err.value.hint is not None and "s3:GetBucketTagging" in err.value.hint
    with pytest.raises(Refused) as err:
        b.set_label("lnk-layout", "2")
    assert err.value.hint is not None and "Tagging" in err.value.hint

    with pytest.raises(Refused):
        open_bucket(f"s3://{OTHER}").put("x", b"1")

    # the owner's own (admin) key labels the bucket
    server.env(monkeypatch, admin["key"], admin["secret"])
    owner = open_bucket(f"s3://{BUCKET}")
    owner.set_label("lnk-layout", "2")
    assert owner.labels()["lnk-layout"] == "2"


def test_unknown_key_is_refused(
    enforcing: tuple[MotoServer, dict[str, str], dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _box, _admin = enforcing
    server.env(monkeypatch, "AKIANOTAREALKEY00000", "nope")
    with pytest.raises(Refused) as err:
        open_bucket(f"s3://{BUCKET}").get("x")
    assert "access key" in err.value.message
