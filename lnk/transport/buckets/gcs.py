"""``gs://bucket/prefix`` through google-cloud-storage.

Credentials are Application Default Credentials.  With
``STORAGE_EMULATOR_HOST`` set, the client talks to that emulator with
anonymous credentials and the project ``GOOGLE_CLOUD_PROJECT`` (or ``test``).
"""

from __future__ import annotations

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


class GCSBucket(CloudBucket):
    scheme = "gs"

    @property
    def client(self) -> Any:
        if self._client is None:
            from google.cloud import storage  # noqa: PLC0415 (heavy: only for a gs:// bucket)

            try:
                if os.environ.get("STORAGE_EMULATOR_HOST"):
                    from google.auth.credentials import AnonymousCredentials  # noqa: PLC0415 (heavy: only for a gs:// bucket)

                    self._client = storage.Client(
                        project=os.environ.get("GOOGLE_CLOUD_PROJECT", "test"),
                        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                    )
                else:
                    self._client = storage.Client()
            except Exception as e:
                self._fail(e, "connecting to Google Cloud Storage", "")
        return self._client

    def _blob(self, key: str) -> Any:
        return self.client.bucket(self.bucket).blob(join_prefix(self.prefix, check_key(key)))

    def _fail(self, e: Exception, what: str, permission: str) -> NoReturn:
        from google.api_core import exceptions as gexc  # noqa: PLC0415 (heavy: only for a gs:// bucket)
        from google.auth import exceptions as aexc  # noqa: PLC0415 (heavy: only for a gs:// bucket)

        if isinstance(e, gexc.NotFound):
            raise NotFound(f"{what}: not found in {self.url}") from e
        if isinstance(e, gexc.Forbidden | gexc.Unauthorized):
            raise Refused(
                f"{what}: access denied on {self.url}",
                hint=f"the credentials in use need {permission} on bucket {self.bucket}",
            ) from e
        if isinstance(e, aexc.DefaultCredentialsError):
            raise Refused(
                f"{what}: no Google Cloud credentials found",
                hint="run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS",
            ) from e
        if isinstance(e, LnkError):
            raise e
        raise TransportError(f"{what} on {self.url} failed: {e}") from e

    def _bucket_missing(self) -> bool:
        try:
            return not self.client.bucket(self.bucket).exists()
        except Exception:
            return False  # cannot tell (e.g. no storage.buckets.get): assume it exists

    def put(self, key: str, data: bytes) -> None:
        blob = self._blob(key)
        try:
            blob.upload_from_string(data, content_type="application/octet-stream")
        except Exception as e:
            self._fail(e, f"writing {key}", "storage.objects.create (and .delete to overwrite)")

    def get(self, key: str) -> bytes:
        blob = self._blob(key)
        try:
            return bytes(blob.download_as_bytes())
        except Exception as e:
            self._fail(e, f"reading {key}", "storage.objects.get")

    def get_range(self, key: str, start: int, length: int) -> bytes:
        from google.api_core import exceptions as gexc  # noqa: PLC0415 (heavy: only for a gs:// bucket)

        if length <= 0:
            return b""
        blob = self._blob(key)
        try:
            return bytes(blob.download_as_bytes(start=start, end=start + length - 1))
        except gexc.RequestRangeNotSatisfiable:  # the range starts past the object's end
            self.get_range(key, 0, 1)  # (NotFound if there is no object at all)
            return b""
        except Exception as e:
            self._fail(e, f"reading {key}", "storage.objects.get")

    def exists(self, key: str) -> bool:
        blob = self._blob(key)
        try:
            found = bool(blob.exists())
        except Exception as e:
            self._fail(e, f"looking for {key}", "storage.objects.get")
        if not found and self._bucket_missing():
            raise NotFound(f"no bucket {self.bucket}", hint="check the bucket name or create it")
        return found

    def entries(self, prefix: str = "") -> Iterator[ObjectInfo]:
        base = join_prefix(self.prefix, "") if self.prefix else ""
        try:
            for blob in self.client.list_blobs(self.bucket, prefix=base + prefix):
                mtime = blob.updated
                if mtime is not None and mtime.tzinfo is None:
                    mtime = mtime.replace(tzinfo=UTC)
                yield ObjectInfo(blob.name[len(base) :], int(blob.size or 0), mtime)
        except Exception as e:
            self._fail(e, f"listing {prefix or '/'}", "storage.objects.list")

    def delete(self, key: str) -> None:
        blob = self._blob(key)
        try:
            blob.delete()
        except Exception as e:
            from google.api_core import exceptions as gexc  # noqa: PLC0415 (heavy: only for a gs:// bucket)

            if isinstance(e, gexc.NotFound) and not self._bucket_missing():
                return
            self._fail(e, f"deleting {key}", "storage.objects.delete")

    def labels(self) -> dict[str, str]:
        try:
            bucket = self.client.get_bucket(self.bucket)
        except Exception as e:
            self._fail(e, "reading the bucket's labels", "storage.buckets.get")
        return {str(k): str(v) for k, v in (bucket.labels or {}).items() if v is not None}

    def set_label(self, name: str, value: str) -> None:
        check_label(name, value)
        # A PATCH carrying only this label: GCS merges label maps key by key,
        # so the others stay and no read (storage.buckets.get) is needed.
        bucket = self.client.bucket(self.bucket)
        bucket.labels = {name: value}
        try:
            bucket.patch()
        except Exception as e:
            self._fail(e, f"setting the bucket label {name}", "storage.buckets.update")
