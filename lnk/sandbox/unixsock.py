"""Connecting to a unix socket whose path is longer than the kernel takes (108 bytes).

An agent's sockets live under ``~/.lnk/agents/.net/<id>/``, which in a deep
HOME passes the limit.  The folder is opened and the socket reached through
``/proc/self/fd/<n>/<name>``, a short path to the same place.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

SUN_PATH_MAX = 107


def connect_unix(sock: socket.socket, path: Path | str) -> None:
    p = str(path)
    if len(os.fsencode(p)) <= SUN_PATH_MAX:
        sock.connect(p)
        return
    folder, name = os.path.split(p)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock.connect(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)
