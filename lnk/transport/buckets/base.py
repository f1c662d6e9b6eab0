"""The one small interface every bucket driver implements.

A :class:`Bucket` is a flat key/value store rooted at a URL's prefix:

* ``s3://bucket/prefix``  (boto3, the AWS credential chain, ``AWS_ENDPOINT_URL``)
* ``gs://bucket/prefix``  (google-cloud-storage, ADC, ``STORAGE_EMULATOR_HOST``)
* ``file:///abs/path``    (a local folder)

Keys are ``/``-separated, relative to the prefix, never empty, never starting
with ``/`` and never containing ``.`` or ``..`` segments.

Errors: a missing object or bucket raises :class:`lnk.errors.NotFound`, a
denied call :class:`lnk.errors.Refused` (its hint names the permission that is
missing), anything else from the service :class:`lnk.errors.TransportError`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lnk.errors import InvalidInput

_LABEL_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its key (relative to the prefix), size and the
    modification time the *storage service* recorded (timezone-aware UTC)."""

    key: str
    size: int
    modified: datetime


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid relative key, else raise InvalidInput."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise InvalidInput(
            f"invalid object key {key!r}",
            hint="keys are relative, '/'-separated, with no empty, '.' or '..' parts",
        )
    return key


def check_label(name: str, value: str) -> None:
    """Labels must fit both S3 tags and GCS labels: lowercase ``[a-z0-9_-]``."""
    if not _LABEL_NAME.match(name):
        raise InvalidInput(
            f"invalid label name {name!r}",
            hint="a label name is 1-63 characters of a-z, 0-9, '_' or '-', starting with a letter",
        )
    if not _LABEL_VALUE.match(value):
        raise InvalidInput(
            f"invalid label value {value!r} for {name}",
            hint="a label value is 0-63 characters of a-z, 0-9, '_' or '-'",
        )


def join_prefix(prefix: str, key: str) -> str:
    """Full object name for ``key`` under ``prefix`` (either may be empty)."""
    if not prefix:
        return key
    return f"{prefix.rstrip('/')}/{key}" if key else prefix.rstrip("/") + "/"


class Bucket(ABC):
    """A bucket (or a prefix of one, or a local folder) holding objects.

    Contract, for every driver:

    * ``put`` is atomic and idempotent: a reader sees the old object or the new
      one, never a part; putting the same key twice overwrites it.
    * ``get`` returns the whole object (use it for objects of a few MiB; callers
      that stream keep their objects small).  ``get_range`` returns at most
      ``length`` bytes from ``start``: fewer at the object's end, none past it.
    * ``list`` is paginated underneath and yields keys in no promised order.
    * ``delete`` of a key that does not exist is not an error.
    * ``labels``/``set_label`` act on the bucket itself (S3 tags, GCS labels,
      a ``.<name>.lnk-labels.json`` file beside a local folder).  They need
      bucket-level permissions that an object-only key lacks: such a key gets
      :class:`lnk.errors.Refused`.  ``set_label`` merges, never drops other
      labels.
    """

    url: str

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any object there."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; NotFound if there is none."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of the object from offset ``start`` (fewer at its
        end, ``b""`` past it); NotFound if there is no object."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    @abstractmethod
    def entries(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, with size and mtime."""

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """``(key, size)`` of every object whose key starts with ``prefix``."""
        for info in self.entries(prefix):
            yield info.key, info.size

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object under ``key``; a missing key is not an error."""

    @abstractmethod
    def labels(self) -> dict[str, str]:
        """The bucket's labels (S3 tags / GCS labels)."""

    @abstractmethod
    def set_label(self, name: str, value: str) -> None:
        """Set one label, keeping every other label the bucket has."""

    @abstractmethod
    def describe(self) -> str:
        """A short name for messages, e.g. ``s3://bkt/prefix``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class CloudBucket(Bucket):
    """A bucket of a cloud's object store, reached through its client library."""

    scheme = ""

    def __init__(self, bucket: str, prefix: str = "", client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        where = f"{self.scheme}://{bucket}"
        self.url = f"{where}/{self.prefix}" if self.prefix else where
        self._client = client

    def describe(self) -> str:
        return self.url
