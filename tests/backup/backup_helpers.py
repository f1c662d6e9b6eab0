"""Helpers for the backup tests."""

from __future__ import annotations

from collections.abc import Iterator

from lnk.transport.buckets import Bucket, ObjectInfo


class CountingBucket(Bucket):
    """A real bucket that counts the calls made through it."""

    def __init__(self, inner: Bucket) -> None:
        self.inner = inner
        self.url = inner.url
        self.puts: list[str] = []
        self.put_bytes = 0
        self.gets: list[str] = []

    def put(self, key: str, data: bytes) -> None:
        self.puts.append(key)
        self.put_bytes += len(data)
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self.inner.get_range(key, start, length)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def entries(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.entries(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def labels(self) -> dict[str, str]:
        return self.inner.labels()

    def set_label(self, name: str, value: str) -> None:
        self.inner.set_label(name, value)

    def describe(self) -> str:
        return self.inner.describe()

    def reset(self) -> None:
        self.puts.clear()
        self.put_bytes = 0
