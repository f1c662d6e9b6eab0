"""File-system steps that never follow a link and never recurse on depth.

A stream may describe a tree of any depth its limits allow (a path of 4096
bytes is 2048 folders), and what the receiver holds of an agent may change
under it between ``--prepare`` and the receive (the agent itself may swap a
folder of its Home for a symbolic link).  So:

- ``rmtree`` (from ``lnk.fsutil``, so layers below this one use it too) removes
  a tree iteratively; it never follows a link and never raises.
- ``open_under`` opens a file below a root folder component by component
  (``O_NOFOLLOW | O_DIRECTORY``), so a link anywhere on the way fails.
- ``take`` copies (or hard-links) such a file into place while hashing it,
  and refuses when its SHA-256 is not the one expected.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from pathlib import Path

from lnk.fsutil import rmtree

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CHUNK = 1 << 20


__all__ = [
    "Changed",
    "Conflict",
    "dest_kind",
    "open_parent",
    "open_under",
    "rmtree",
    "sha256_fd",
    "take",
]


class Changed(Exception):
    """Held content is not what it was: another SHA-256, not a file, or a link on the way."""


# ---- reading held content ------------------------------------------------------------------
def open_parent(root: Path, rel: str) -> tuple[int, str]:
    """The folder holding ``root/rel`` (opened without following a link below ``root``)
    and the last name of ``rel``.  Raises OSError (ELOOP or ENOTDIR for a link)."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, "not a plain relative path", rel)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nfd = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def open_under(root: Path, rel: str) -> int:
    """Open the regular file ``root/rel`` for reading, following no link below ``root``."""
    dfd, name = open_parent(root, rel)
    try:
        fd = os.open(name, _FILE, dir_fd=dfd)
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", rel)
    return fd


def sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    pos = 0
    while chunk := os.pread(fd, CHUNK, pos):
        h.update(chunk)
        pos += len(chunk)
    return h.hexdigest()


def _why(e: OSError) -> str:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return "a symbolic link or a file is now on the way to it"
    if e.errno == errno.ENOENT:
        return "it is gone"
    if e.errno == errno.EINVAL:
        return "it is no longer a regular file"
    return f"it cannot be read ({e.strerror})"


def take(
    root: Path, rel: str, target: Path | str, sha: str, *, link: bool = False, verify: bool = True
) -> None:
    """Put the held file ``root/rel`` at ``target``, a copy (or, with ``link``, a hard link
    when nothing else links it), checking while reading that its SHA-256 is ``sha``.

    Raises :class:`Changed` (``target`` then does not exist) when it is not, or when the
    file cannot be reached without following a link; OSError for ``target``'s side.
    """
    try:
        dfd, name = open_parent(root, rel)
    except OSError as e:
        raise Changed(_why(e)) from None
    try:
        try:
            fd = os.open(name, _FILE, dir_fd=dfd)
        except OSError as e:
            raise Changed(_why(e)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Changed("it is no longer a regular file")
            if link and st.st_nlink == 1:
                os.link(name, target, src_dir_fd=dfd, follow_symlinks=False)
                lt = os.lstat(target)
                if (lt.st_dev, lt.st_ino) != (st.st_dev, st.st_ino) or (
                    verify and sha256_fd(fd) != sha
                ):
                    os.unlink(target)
                    raise Changed("it changed since the receiver was prepared")
                return
            _copy(fd, target, sha if verify else None)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def _copy(fd: int, target: Path | str, sha: str | None) -> None:
    h = hashlib.sha256()
    ok = False
    out = os.open(
        target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        pos = 0
        while chunk := os.pread(fd, CHUNK, pos):
            if sha is not None:
                h.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
            pos += len(chunk)
        ok = sha is None or h.hexdigest() == sha
    finally:
        os.close(out)
        if not ok:
            with contextlib.suppress(OSError):
                os.unlink(target)
    if not ok:
        raise Changed("it changed since the receiver was prepared")


# ---- what the destination holds -------------------------------------------------------------
class Conflict(Exception):
    pass


def dest_kind(
    dest: Path | str,
    stop: Path | str,
    safe: set[str] | None = None,
    missing: set[str] | None = None,
) -> str | None:
    """What the destination holds at ``dest``: None, "f", "d", "l" (a symbolic link,
    never followed) or "x"; raises Conflict if a folder above it is a link.

    ``safe``: folders already seen to be real folders (not links) in this pass, so a
    folder of many files costs one lstat a file, not one per folder above it.
    ``missing``: folders seen not to exist in this pass (only while nothing is written
    to the destination): nothing below them exists, and what is above them was seen."""
    d, top = str(dest), str(stop)
    parent = os.path.dirname(d)
    if missing is not None and d != top and parent in missing:
        return None
    kind: str | None = None
    try:
        m = os.lstat(d).st_mode
        kind = (
            "l" if stat.S_ISLNK(m) else "d" if stat.S_ISDIR(m) else "f" if stat.S_ISREG(m) else "x"
        )
    except FileNotFoundError:
        pass
    if d == top:
        return kind
    p = parent
    seen: list[str] = []
    while len(p) >= len(top) and (safe is None or p not in safe):
        if missing is not None and p in missing:
            break
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            st = None
            if missing is not None:
                missing.add(p)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise Conflict(f"{p} is a symbolic link")
        if st is not None and stat.S_ISDIR(st.st_mode):
            seen.append(p)
        if p == top or os.path.dirname(p) == p:
            break
        p = os.path.dirname(p)
    if safe is not None:
        safe.update(seen)
    return kind
