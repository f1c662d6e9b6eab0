"""How the plain-files driver (``files.py``) puts bytes on disk.

File names for collection names and keys: percent-encoded (everything but
``A-Za-z0-9_-``), or, when that would be long, ``~`` and their SHA-256.

Atomic writes: a file is written aside and then either hard-linked to its
name (link(2) fails if the name exists, so exactly one of any number of racing
writers wins, and a reader never sees half a file) or renamed over it; a
folder is fsynced after a change when the store asks for it; writers of one
file serialise on a flock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lnk.collections.ids import MAX_VALUE_BYTES
from lnk.errors import InvalidInput

MAX_FILE = MAX_VALUE_BYTES + (64 << 10)
"""The longest file the store writes: a value and, for a map's entry, its key."""

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_MAX_ENCODED = 150


def encode_name(name: str) -> str:
    """A file name for ``name``: never empty, never starting with '.', at most 151 bytes."""
    out = "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in name)
    if len(out) > _MAX_ENCODED:
        return "~" + hashlib.sha256(name.encode()).hexdigest()
    return out


def decode_name(enc: str) -> str | None:
    """The name ``encode_name`` encoded, or None where it kept only a hash."""
    if enc.startswith("~"):
        return None
    return bytes(_unquote(enc)).decode()


def _unquote(enc: str) -> bytearray:
    out = bytearray()
    i = 0
    while i < len(enc):
        if enc[i] == "%":
            out.append(int(enc[i + 1 : i + 3], 16))
            i += 3
        else:
            out += enc[i].encode()
            i += 1
    return out


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# no such file there: gone, a link (never followed), not a folder on the way, a fifo's
# side that no one holds
_NONE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO)


def open_folder(root: Path, *names: str) -> int | None:
    """The folder ``root/names...``, opened name by name without following a link (the
    agent writes its store's folders, and may plant links in them); None if there is
    no such folder."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            nfd = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError as e:
        os.close(fd)
        if e.errno in _NONE:
            return None
        raise
    return fd


def read_in(dfd: int, name: str, folder: str = "") -> bytes | None:
    """A regular file's bytes in the folder ``dfd``, never through a link; None if there
    is none (gone, a link, a fifo or anything else).  A file longer than any the store
    writes (:data:`MAX_FILE`) is refused, naming it (by :func:`shown`), before more than
    that is read: the agent writes these folders."""
    try:
        fd = os.open(name, _READ, dir_fd=dfd)
    except OSError as e:
        if e.errno in _NONE:
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, size = [], 0
        while size <= MAX_FILE and (chunk := os.read(fd, MAX_FILE + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_FILE:
        raise InvalidInput(
            f"the store's file {shown(folder, name)} is longer than any it writes "
            f"(at most {MAX_FILE} bytes)"
        )
    return b"".join(chunks)


def read_below(root: Path, *parts: str) -> bytes | None:
    """:func:`read_in` of the file ``root/parts...``, every name on the way a folder."""
    dfd = open_folder(root, *parts[:-1])
    if dfd is None:
        return None
    try:
        return read_in(dfd, parts[-1], "/".join(parts[:-1]))
    finally:
        os.close(dfd)


def shown(folder: str, name: str) -> str:
    """A file of the store named in a refusal: by its path there (``folder``, as far as
    the reader knows it, and its name), made only when one is refused."""
    return f"{folder}/{name}" if folder else name


def event_file(n: int) -> str:
    return f"{n:012d}.json"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass(frozen=True)
class AtomicWrites:
    """Whole-file writes under one policy: ``fsync`` files and folders or not;
    ``private`` (one writer and no reader until it is done) creates in place."""

    fsync: bool = True
    private: bool = False

    def sync_dir(self, d: Path) -> None:
        if self.fsync:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def write_aside(self, d: Path, data: bytes) -> Path:
        """Write ``data`` to a new temporary file in ``d``; return its path."""
        tmp = d / f".tmp-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_all(fd, data)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def replace(self, path: Path, data: bytes, sync_dir: bool = True) -> None:
        tmp = self.write_aside(path.parent, data)
        os.replace(tmp, path)
        if sync_dir:
            self.sync_dir(path.parent)

    def publish(self, path: Path, data: bytes) -> bool:
        """Create ``path`` with ``data`` only if it does not exist (atomically)."""
        if self.private:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return False
            try:
                write_all(fd, data)
            finally:
                os.close(fd)
            return True
        tmp = self.write_aside(path.parent, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        self.sync_dir(path.parent)
        return True


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
