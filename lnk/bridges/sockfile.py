"""A bridge's socket file: made with its mode from the start, removed only if ours."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
from pathlib import Path

from lnk.errors import AlreadyExists, InvalidInput

SUN_PATH_MAX = 107
"""sockaddr_un.sun_path holds 108 bytes on Linux, its NUL included."""


def listening_socket(path: Path, mode: int) -> tuple[socket.socket, int]:
    """A non-blocking unix socket listening at ``path`` with ``mode``; and its inode.

    A missing parent directory is made 0700.  The socket is bound under a
    random temporary name, given its mode and set listening, and only then
    renamed to ``path``: there is no moment when ``path`` has a wider mode,
    or is there but refuses connections.  A stale socket (nobody listening)
    is replaced; a live one, or anything that is not a socket, is not.
    """
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True)
        os.chmod(parent, 0o700)
    tmp = parent / f".lnk-{secrets.token_hex(4)}"
    for p in (path, tmp):
        if len(os.fsencode(p)) > SUN_PATH_MAX:
            raise InvalidInput(
                f"the socket path {p} is too long for a unix socket",
                hint=f"use a path of at most {SUN_PATH_MAX} bytes",
            )
    _check_existing(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(tmp))
        try:
            os.chmod(tmp, mode)
            sock.listen(128)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        inode = os.stat(path).st_ino
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock, inode


def _check_existing(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise AlreadyExists(
            f"{path} exists and is not a socket",
            hint="remove it or choose another path for the bridge",
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(os.fspath(path))
    except OSError:
        return  # stale: nobody listens there, so it will be replaced
    finally:
        probe.close()
    raise AlreadyExists(
        f"a bridge server already listens at {path}",
        hint="stop it first, or choose another path",
    )


def unlink_if_ours(path: Path, inode: int) -> None:
    """Remove ``path`` if it is still the socket we made (not a successor's)."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)
