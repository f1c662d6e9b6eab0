"""``s3://bucket/prefix`` through boto3.

Credentials come from the AWS chain (env, profile, instance role).  When
``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) is set, requests go there with
path-style addressing, which S3-compatible servers (MinIO, Ceph, moto) expect.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import UTC
from typing import Any, NoReturn

from lnk.errors import LnkError, NotFound, Refused, TransportError
from lnk.transport.buckets.base import (
    CloudBucket,
    ObjectInfo,
    check_key,
    check_label,
    join_prefix,
)


def _status(e: Exception) -> str:
    """The HTTP status of a botocore ClientError ("" for any other error)."""
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
_DENIED = {"AccessDenied", "403", "Forbidden", "AllAccessDisabled"}
_BAD_KEY = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}


class S3Bucket(CloudBucket):
    scheme = "s3"

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3  # noqa: PLC0415 (heavy: only for an s3:// bucket)
            from botocore.config import Config  # noqa: PLC0415 (heavy: only for an s3:// bucket)

            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            style = "path" if endpoint else "auto"
            cfg = Config(
                s3={"addressing_style": style}, retries={"max_attempts": 5, "mode": "standard"}
            )
            # a session of its own: the default one caches the credentials it
            # first found, and a test (or a caller) may switch them
            session = boto3.session.Session()
            self._client = session.client("s3", endpoint_url=endpoint or None, config=cfg)
        return self._client

    def _name(self, key: str) -> str:
        return join_prefix(self.prefix, check_key(key))

    def _fail(self, e: Exception, what: str, permission: str) -> NoReturn:
        from botocore.exceptions import (  # noqa: PLC0415 (heavy: only for an s3:// bucket)
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        if isinstance(e, ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            if code == "NoSuchBucket":
                raise NotFound(
                    f"no bucket {self.bucket} ({what})",
                    hint="check the bucket name and region, or create the bucket",
                ) from e
            if code in _NOT_FOUND or (status == "404" and not code):
                raise NotFound(f"{what}: not found in {self.url}") from e
            if code == "NoSuchTagSet":
                raise NotFound(f"{what}: {self.url} has no tags") from e
            if code in _BAD_KEY:
                raise Refused(
                    f"{what}: S3 rejected the access key ({code})",
                    hint="check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or your AWS profile",
                ) from e
            if code in _DENIED or status == "403":
                raise Refused(
                    f"{what}: access denied on {self.url}",
                    hint=f"the credentials in use need {permission} on bucket {self.bucket}",
                ) from e
            raise TransportError(
                f"{what} on {self.url} failed: {code} {err.get('Message', '')}".strip()
            ) from e
        if isinstance(e, NoCredentialsError | PartialCredentialsError):
            raise Refused(
                f"{what}: no AWS credentials found",
                hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
            ) from e
        if isinstance(e, EndpointConnectionError):
            raise TransportError(
                f"{what}: cannot reach S3 at {e.kwargs.get('endpoint_url', '?')}",
                hint="check your network and AWS_ENDPOINT_URL",
            ) from e
        if isinstance(e, LnkError):
            raise e
        raise TransportError(f"{what} on {self.url} failed: {e}") from e

    def put(self, key: str, data: bytes) -> None:
        name = self._name(key)
        try:
            self.client.put_object(Bucket=self.bucket, Key=name, Body=data)
        except Exception as e:
            self._fail(e, f"writing {key}", "s3:PutObject")

    def get(self, key: str) -> bytes:
        try:
            return self._body(key)
        except Exception as e:
            self._fail(e, f"reading {key}", "s3:GetObject")

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            return self._body(key, Range=f"bytes={start}-{start + length - 1}")
        except Exception as e:
            if _status(e) == "416":  # the range starts past the object's end
                self.get_range(key, 0, 1)  # (NotFound if there is no object at all)
                return b""
            self._fail(e, f"reading {key}", "s3:GetObject")

    def _body(self, key: str, **kw: str) -> bytes:
        resp = self.client.get_object(Bucket=self.bucket, Key=self._name(key), **kw)
        body = resp["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        name = self._name(key)
        try:
            self.client.head_object(Bucket=self.bucket, Key=name)
            return True
        except Exception as e:
            with contextlib.suppress(NotFound):
                self._fail(e, f"looking for {key}", "s3:GetObject and s3:ListBucket")
        # HEAD answers a bare 404 for a missing key and a missing bucket alike
        try:
            self.client.list_objects_v2(Bucket=self.bucket, MaxKeys=1)
        except Exception as e:
            try:
                self._fail(e, f"looking for {key}", "s3:ListBucket")
            except NotFound as nf:
                raise NotFound(
                    f"no bucket {self.bucket} (looking for {key})",
                    hint="check the bucket name and region, or create the bucket",
                ) from nf
        return False

    def entries(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full = join_prefix(self.prefix, "") + prefix if self.prefix else prefix
        strip = len(join_prefix(self.prefix, "")) if self.prefix else 0
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    mtime = obj["LastModified"]
                    if mtime.tzinfo is None:
                        mtime = mtime.replace(tzinfo=UTC)
                    yield ObjectInfo(obj["Key"][strip:], int(obj["Size"]), mtime)
        except Exception as e:
            self._fail(e, f"listing {prefix or '/'}", "s3:ListBucket")

    def delete(self, key: str) -> None:
        name = self._name(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=name)
        except Exception as e:
            try:
                self._fail(e, f"deleting {key}", "s3:DeleteObject")
            except NotFound as nf:
                if "no bucket" in nf.message:
                    raise

    def labels(self) -> dict[str, str]:
        try:
            resp = self.client.get_bucket_tagging(Bucket=self.bucket)
        except Exception as e:
            try:
                self._fail(e, "reading the bucket's tags", "s3:GetBucketTagging")
            except NotFound as nf:
                if "no bucket" in nf.message:
                    raise
                return {}
        return {t["Key"]: t["Value"] for t in resp.get("TagSet", [])}

    def set_label(self, name: str, value: str) -> None:
        check_label(name, value)
        tags = self.labels()
        tags[name] = value
        tagset = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
        try:
            self.client.put_bucket_tagging(Bucket=self.bucket, Tagging={"TagSet": tagset})
        except Exception as e:
            self._fail(e, f"setting the bucket tag {name}", "s3:PutBucketTagging")
