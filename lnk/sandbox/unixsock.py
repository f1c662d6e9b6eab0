"""Connecting to a unix socket in a folder a sandbox can write, never through a link.

An agent's sockets live under ``~/.lnk/agents/.net/<id>/``, which its sandbox
writes (the harness makes its endpoint's socket there).  A link the agent
plants there would lead lnk's own connections (the relay, ``lnk agent
status``) to any socket of this machine, another agent's included, if they
followed it.  So the socket is opened as itself (``O_PATH | O_NOFOLLOW``,
from its folder, opened the same way), checked to be a socket, and reached
through ``/proc/self/fd/<n>``: the descriptor names the socket that was
checked, whatever the path names a moment later.  It is also the short path
that reaches a socket deeper than the kernel's 108 bytes.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

SUN_PATH_MAX = 107


def connect_unix(sock: socket.socket, path: Path | str) -> None:
    """Connect ``sock`` to the socket at ``path``; OSError if it isn't one (a link included)."""
    folder, name = os.path.split(str(path))
    dfd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(errno.ECONNREFUSED, f"{path} is not a socket")
        sock.connect(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
