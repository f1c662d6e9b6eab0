"""Buckets: S3, GCS and local folders behind one small interface.

from lnk.transport.buckets import open_bucket
b = open_bucket("s3://my-bucket/agents/ada")
b.put("hello", b"world")
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from lnk.errors import UsageError
from lnk.transport.buckets.base import Bucket, ObjectInfo
from lnk.transport.buckets.gcs import GCSBucket
from lnk.transport.buckets.local import LocalBucket
from lnk.transport.buckets.s3 import S3Bucket

__all__ = ["Bucket", "ObjectInfo", "open_bucket"]

_FORMS = "s3://bucket/prefix, gs://bucket/prefix or file:///absolute/path"


def open_bucket(url: str) -> Bucket:
    """A :class:`Bucket` for ``url``; UsageError for any other form.

    Nothing is contacted here: a missing bucket shows on the first call.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("s3", "gs"):
        if not parts.netloc:
            raise UsageError(f"no bucket name in {url!r}", hint=f"write it as {_FORMS}")
        prefix = parts.path.strip("/")
        if scheme == "s3":
            return S3Bucket(parts.netloc, prefix)
        return GCSBucket(parts.netloc, prefix)
    if scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise UsageError(
                f"a file URL needs an absolute path: {url!r}",
                hint="write it as file:///absolute/path (three slashes)",
            )
        return LocalBucket(path)
    raise UsageError(f"unsupported bucket URL {url!r}", hint=f"write it as {_FORMS}")
