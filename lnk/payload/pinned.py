"""Reaching an agent's files through its own folders only, checked at use.

An agent changes its folders while a walk lists them and while a send or a backup
reads what the walk found, and from inside its sandbox it may swap one of its folders
for a link to a place it cannot see, to have what is there carried (by a backup it
could then restore, or a move).  A check when the walk looked is not enough, so:

- a walk lists each folder through a descriptor opened from the folder above it,
  never through a link, and checked to be the folder the listing above saw
  (:class:`Way`): what it lists is in the agent's folders, whatever is renamed or
  linked meanwhile;
- a file is read only as the very file the walk found (:func:`open_walked`): opened by
  its path, its device and inode must be the walk's; otherwise (replaced since, or a
  folder on its way swapped) it is opened again from the agent's folder component by
  component, following no link, and that file is read, or none;
- a SQLite database is read by SQLite, which opens it by a path of its own: it is
  given a private hard link to the very file the walk found (``snapshots.py``).
"""

from __future__ import annotations

import errno
import hashlib
import operator
import os
import shlex
from pathlib import Path

from lnk.errors import InvalidInput
from lnk.payload.safefs import open_parent, open_under

SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
READ_CHUNK = 1 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# an open that found no file, or a link or a non-folder on the way, or not a regular file
GONE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EINVAL)

Ident = tuple[int, int]


def ident(st: os.stat_result) -> Ident:
    return st.st_dev, st.st_ino


def same_stat(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stats say the same content: inode, size, mtime and ctime."""
    return (a.st_ino, a.st_size, a.st_mtime_ns, a.st_ctime_ns) == (
        b.st_ino,
        b.st_size,
        b.st_mtime_ns,
        b.st_ctime_ns,
    )


def open_file(path: str | bytes | Path) -> int:
    """Open a file to read its content: never through a link (its last name), and never
    blocking (a fifo swapped in after the walk opens at once, and is then no regular
    file).  An agent's file is opened by :func:`open_walked`, which also minds the
    folders on the way."""
    return os.open(path, _OPEN)


def root_of(source: str | Path, rel: str) -> Path:
    s = os.fspath(source)
    if not rel or not s.endswith("/" + rel):
        raise OSError(errno.EINVAL, "not under its agent's folder", s)
    return Path(s[: -len(rel) - 1])


def open_walked(
    source: str | Path, rel: str, st: os.stat_result | None
) -> tuple[int, os.stat_result]:
    """Open the file a walk found at ``rel`` (``source``: its path, ``st``: the walk's
    lstat of it) to read it, and its ``fstat``: by its path while that is the very file
    (device and inode), else again from the agent's folder, component by component and
    following no link.  Raises OSError (:data:`GONE` for no regular file there now)."""
    fd = open_file(source)
    try:
        now = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if st is None or ident(now) == ident(st):
        return fd, now
    os.close(fd)
    fd = open_under(root_of(source, rel), rel)
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def leads_to(source: str | Path, rel: str, st: os.stat_result) -> bool:
    """Whether ``rel`` leads, through folders only, to the very file ``st`` is of."""
    try:
        dfd, name = open_parent(root_of(source, rel), rel)
    except OSError:
        return False
    try:
        return ident(os.stat(name, dir_fd=dfd, follow_symlinks=False)) == ident(st)
    except OSError:
        return False
    finally:
        os.close(dfd)


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file of lnk's own (a private snapshot)."""
    sha = _sha256_fd(open_file(path), False)
    assert sha is not None
    return sha


def _sha256_fd(fd: int, unless_sqlite: bool) -> str | None:
    h = hashlib.sha256()
    with os.fdopen(fd, "rb", buffering=0) as f:
        buf = bytearray(READ_CHUNK)
        view = memoryview(buf)
        first = True
        while n := f.readinto(buf):
            if first and unless_sqlite and view[:16] == SQLITE_MAGIC:
                return None
            first = False
            h.update(view[:n])
    return h.hexdigest()


def sha256_walked(
    source: str | Path, rel: str, st: os.stat_result | None, unless_sqlite: bool = False
) -> str | None:
    """The SHA-256 of the file a walk found (:func:`open_walked`); with ``unless_sqlite``,
    None (nothing more read) if it starts as a SQLite database."""
    fd, _ = open_walked(source, rel, st)
    return _sha256_fd(fd, unless_sqlite)


def starts_as_sqlite(source: str | Path, rel: str, st: os.stat_result | None) -> bool:
    """Whether the file a walk found starts as a SQLite database (False: none there)."""
    try:
        fd, _ = open_walked(source, rel, st)
    except OSError:
        return False
    try:
        return os.read(fd, 16) == SQLITE_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


# ---- walking ------------------------------------------------------------------------------
Listing = list[tuple[str, os.stat_result]]


class Way:
    """Where a walk is: the folder it lists, held open (one descriptor and its root's,
    whatever the depth).  It goes down into a subfolder its listing found (opened from
    this folder without following a link, checked to be the folder listed) and back up
    through ``..`` (checked to be the folder it came from; else found again from the
    root by name, or lost: nothing more is listed, entered or read through it)."""

    def __init__(self, top: str, st: os.stat_result) -> None:
        self.top = os.open(top, _DIR)
        if ident(os.fstat(self.top)) != ident(st):
            os.close(self.top)
            raise OSError(errno.ESTALE, "not the folder walked", top)
        self.fd = os.dup(self.top)
        self.ids: list[Ident] = [ident(st)]
        self.names: list[str] = []

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.top >= 0:
            os.close(self.top)
            self.top = -1

    def __enter__(self) -> Way:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def listing(self, where: str) -> Listing:
        """The folder's entries sorted by name, each with its lstat (one gone meanwhile
        left out); a name that is not UTF-8 is refused (a stream and a backup carry
        UTF-8 names: one left out would be lost without a word).  ``where``: the
        folder's path, for that refusal."""
        if self.fd < 0:
            return []
        try:
            with os.scandir(self.fd) as it:
                entries = sorted(it, key=_name)
        except OSError:
            return []
        out: Listing = []
        for e in entries:
            if not e.name.isascii():
                try:
                    e.name.encode()
                except UnicodeEncodeError:
                    raise not_utf8(where, e.name) from None
            try:
                out.append((e.name, e.stat(follow_symlinks=False)))
            except OSError:
                continue
        return out

    def down(self, name: str, st: os.stat_result) -> bool:
        """Into the subfolder ``name`` the listing saw with lstat ``st``; False (and
        still here) if it is gone, or is no longer that folder."""
        if self.fd < 0:
            return False
        try:
            fd = os.open(name, _DIR, dir_fd=self.fd)
        except OSError:
            return False
        if ident(os.fstat(fd)) != ident(st):
            os.close(fd)
            return False
        os.close(self.fd)
        self.fd = fd
        self.ids.append(ident(st))
        self.names.append(name)
        return True

    def up(self) -> bool:
        """Back to the folder above (after a :meth:`down` that succeeded); False if it
        cannot be found as it was."""
        self.ids.pop()
        self.names.pop()
        fd = -1
        if self.fd >= 0:
            try:
                fd = os.open("..", _DIR, dir_fd=self.fd)
            except OSError:
                fd = -1
            os.close(self.fd)
        if fd >= 0 and ident(os.fstat(fd)) != self.ids[-1]:
            os.close(fd)
            fd = -1
        self.fd = fd if fd >= 0 else self._again()
        return self.fd >= 0

    def _again(self) -> int:
        """The folder the walk is in, found again from its root by name; -1 if not."""
        fd = os.dup(self.top)
        try:
            for name, want in zip(self.names, self.ids[1:], strict=True):
                nfd = os.open(name, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nfd
                if ident(os.fstat(fd)) != want:
                    os.close(fd)
                    return -1
        except OSError:
            os.close(fd)
            return -1
        return fd

    def readlink(self, name: str) -> str | None:
        """A link's target in this folder as text, if it can travel (UTF-8, no longer
        than a path)."""
        if self.fd < 0:
            return None
        try:
            target = os.readlink(name, dir_fd=self.fd)
            if len(target.encode("utf-8")) > 4096 or not target:
                return None
        except (OSError, UnicodeEncodeError):
            return None  # gone meanwhile, or not UTF-8: skipped and counted
        return target


_name = operator.attrgetter("name")


def not_utf8(folder: Path | str, name: str) -> InvalidInput:
    where = shown(os.fsdecode(folder))
    return InvalidInput(
        f"{where}/{shown(name)}: the name is not UTF-8, and lnk carries UTF-8 names only",
        hint=f"ls -b -- {shlex.quote(where)}  # then rename it with mv",
    )


def shown(text: str) -> str:
    """A name as text, a byte that is not UTF-8 shown as ``\\xff``."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")
