"""``file:///path``: a local folder as a bucket.

Objects are files under the folder; a put writes a temporary file in
``<root>/.lnk-tmp/``, fsyncs it and renames it into place, so a reader sees the
old file or the new one.  Labels live in ``.<name>.lnk-labels.json`` beside
the folder (outside it, as a bucket's labels are outside its objects).

A local bucket never writes into a folder that is something else: a new
repository (its ``config``) or a first label is refused in a folder that holds
anything and is not an lnk repository (a URL that named someone's HOME).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from lnk.errors import NotFound, Refused
from lnk.transport.buckets.base import Bucket, ObjectInfo, check_key, check_label

_TMP = ".lnk-tmp"


class LocalBucket(Bucket):
    """A folder that must already exist (as a bucket must)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = f"file://{self.root}"

    def describe(self) -> str:
        return self.url

    def _need_root(self) -> None:
        if not self.root.is_dir():
            raise NotFound(
                f"no folder {self.root} for bucket {self.url}",
                hint=f"create it first: mkdir -p {self.root}",
            )

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _check_ours(self) -> None:
        """Refuse a non-empty folder that is not an lnk repository."""
        if (self.root / "config").is_file() or self.labels_file.exists():
            return
        with os.scandir(self.root) as it:
            other = next((e.name for e in it if e.name != _TMP), None)
        if other is not None:
            raise Refused(
                f"{self.root} holds other things ({other!r}) and is not an lnk repository; "
                "a local bucket never writes into it",
                hint=f"name an empty folder (mkdir {self.root}-lnk) or an existing lnk bucket",
            )

    def put(self, key: str, data: bytes) -> None:
        self._need_root()
        if key == "config":  # a repository begins here
            self._check_ours()
        target = self._path(key)
        if key.split("/")[0] == _TMP:
            raise Refused(f"the key {key!r} is reserved in {self.url}")
        tmpdir = self.root / _TMP
        try:
            tmpdir.mkdir(exist_ok=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = tmpdir / f"{secrets.token_hex(8)}.part"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        except PermissionError as e:
            raise Refused(
                f"cannot write {key} in {self.url}: {e.strerror}",
                hint=f"give this user write permission on {self.root}",
            ) from e

    def get(self, key: str) -> bytes:
        return self._read(key, 0, -1)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        return self._read(key, start, length) if length > 0 else b""

    def _read(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (-1: to the end)."""
        self._need_root()
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise NotFound(f"no object {key} in {self.url}") from e
        except PermissionError as e:
            raise Refused(
                f"cannot read {key} in {self.url}: {e.strerror}",
                hint=f"give this user read permission on {self.root}",
            ) from e

    def exists(self, key: str) -> bool:
        self._need_root()
        return self._path(key).is_file()

    def entries(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._need_root()
        # walk only the folder the prefix names, then filter by the rest
        base = self.root
        head, _, _ = prefix.rpartition("/")
        if head:
            base = self.root / check_key(head)
            if not base.is_dir():
                return
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = os.path.relpath(dirpath, self.root)
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if d != _TMP]
                rel_dir = ""
            dirnames.sort()
            for name in sorted(filenames):
                key = f"{rel_dir}/{name}" if rel_dir else name
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while we listed
                yield ObjectInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def delete(self, key: str) -> None:
        self._need_root()
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except PermissionError as e:
            raise Refused(
                f"cannot delete {key} in {self.url}: {e.strerror}",
                hint=f"give this user write permission on {self.root}",
            ) from e
        # tidy empty folders up to the root
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    @property
    def labels_file(self) -> Path:
        return self.root.parent / f".{self.root.name}.lnk-labels.json"

    def labels(self) -> dict[str, str]:
        self._need_root()
        try:
            data = json.loads(self.labels_file.read_text())
        except FileNotFoundError:
            return {}
        except PermissionError as e:
            raise Refused(
                f"cannot read the labels of {self.url}: {e.strerror}",
                hint=f"give this user read permission on {self.labels_file}",
            ) from e
        return {str(k): str(v) for k, v in data.items()}

    def set_label(self, name: str, value: str) -> None:
        check_label(name, value)
        current = self.labels()
        if not current:
            self._check_ours()
        current[name] = value
        tmp = self.labels_file.with_name(self.labels_file.name + f".{secrets.token_hex(4)}")
        try:
            tmp.write_text(json.dumps(current, sort_keys=True, indent=1) + "\n")
            os.replace(tmp, self.labels_file)
        except PermissionError as e:
            raise Refused(
                f"cannot write the labels of {self.url}: {e.strerror}",
                hint=f"give this user write permission on {self.labels_file.parent}",
            ) from e
