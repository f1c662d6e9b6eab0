"""OpenSSH connection sharing: one master connection per box for a whole move.

A move runs a dozen ``ssh box lnk ...`` steps; each would pay a TCP connection,
a key exchange and an authentication.  Inside :func:`shared`, every
:class:`lnk.transport.legs.SshLeg` command is run with

    -o ControlMaster=auto -o ControlPath=<folder>/%C -o ControlPersist=<s>

so the first step to a box opens a master connection (OpenSSH backgrounds it)
and every later one runs as a new session over it.  ``<folder>`` is a private
folder (mode 0700, made for this run, so no other user can reach a socket
in it); at the end each master is closed (``ssh -O exit``) and the folder
removed.  ``ControlPersist`` is short, so a master that lnk could not close
(lnk killed) ends by itself once idle.

It is still the user's own ssh (``LNK_SSH_COMMAND`` or ``ssh``): their
``~/.ssh/config``, agent, keys and known hosts apply; the ``-o`` options given
here take precedence over the config's Control* settings for the run.  A master
that dies midway breaks the sessions it carried (ssh exits 255, as for any
broken connection); the next step finds its socket stale, and ssh (``auto``)
removes it and opens a new master.  ``LNK_SSH_SHARE=0`` turns sharing off (and
must, for an ``LNK_SSH_COMMAND`` that is not OpenSSH's client).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

PERSIST_S = 30
"""How long an idle master lives on when lnk did not close it (lnk was killed)."""

_CLOSE_TIMEOUT_S = 10.0

_lock = threading.Lock()
_folder: Path | None = None
_depth = 0
_opened: set[tuple[tuple[str, ...], str]] = set()
# a leg's lnk server inside the block (lnk.transport.served): its key -> the server, or
# None when none could start; and how each is stopped at the block's end
_servers: dict[str, Served | None] = {}
_stops: list[Callable[[], None]] = []
_starting: dict[str, threading.Lock] = {}  # one start at a time per place


def enabled() -> bool:
    """Whether sharing is on (``LNK_SSH_SHARE`` is not ``0``)."""
    return os.environ.get("LNK_SSH_SHARE", "1").strip() != "0"


def serving() -> bool:
    """Whether a move's steps go through one lnk server per box (``LNK_BOX_SERVE`` is
    not ``0``)."""
    return os.environ.get("LNK_BOX_SERVE", "1").strip() != "0"


@dataclass(frozen=True)
class Served:
    """A place's lnk server as its steps reach it: its socket, and the caller it offered
    (:func:`lnk.transport.served.caller`; None: steps call ``lnk --served-by``)."""

    socket: str
    caller: tuple[str, ...] | None = None


ServerStart = Callable[[], tuple[Served, Callable[[], None]] | None]


def server(key: str, start: ServerStart) -> Served | None:
    """Inside a :func:`shared` block, the lnk server for the place ``key``: started by
    ``start`` the first time (which gives the server and how to stop it, or None when
    the place has none; it is not asked again in this block)."""
    with _lock:
        if _depth == 0 or not serving():
            return None
        if key in _servers:
            return _servers[key]
        starting = _starting.setdefault(key, threading.Lock())
    with starting:
        with _lock:
            if key in _servers:
                return _servers[key]
        got = start()
        with _lock:
            if _depth == 0:  # the block ended meanwhile
                if got is not None:
                    _stops.append(got[1])
                return None
            _servers[key] = got[0] if got else None
            if got is not None:
                _stops.append(got[1])
            return _servers[key]


def options(ssh: list[str], destination: str) -> list[str]:
    """The ``-o`` options that put this command on the shared connection (none when
    no :func:`shared` block is open, or sharing is off); the master to close is noted."""
    with _lock:
        if _folder is None:
            return []
        _opened.add((tuple(ssh), destination))
        return [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={_folder}/%C",
            "-o",
            f"ControlPersist={PERSIST_S}",
        ]


def socket_base() -> Path:
    """Where a private folder of sockets goes, with a short path (a socket's path is at
    most about 100 bytes): ``XDG_RUNTIME_DIR`` when it is set and short, else /tmp."""
    run = os.environ.get("XDG_RUNTIME_DIR", "")
    return Path(run if run and len(run) <= 40 and os.path.isdir(run) else "/tmp")


def _private_folder() -> Path:
    """A new 0700 folder for the ssh masters' sockets (:func:`socket_base`)."""
    base = socket_base()
    return Path(tempfile.mkdtemp(prefix="lnk-ssh-", dir=base if base.is_dir() else None))


@contextlib.contextmanager
def shared() -> Iterator[Path | None]:
    """Share one connection per box among the ssh commands run inside (nested blocks
    join the outermost), and one lnk server per place (:func:`server`); every master
    opened and every server started is closed when the outermost ends."""
    global _folder, _depth
    with _lock:
        _depth += 1
        if _folder is None and enabled():
            _folder = _private_folder()
        mine = _folder
    try:
        yield mine
    finally:
        with _lock:
            last = _depth == 1
            if last:
                stops = list(_stops)
                _stops.clear()
                _servers.clear()
                _starting.clear()
        if last:
            _each(stops, lambda stop: stop())  # over the shared connections, before they close
        with _lock:
            _depth -= 1
            last = _depth == 0
            if last:
                _folder = None
                opened = sorted(_opened)
                _opened.clear()
        if last and mine is not None:
            close(mine, opened)


def close(where: Path, opened: list[tuple[tuple[str, ...], str]]) -> None:
    """Close every master whose socket is in ``where`` (``ssh -O exit``), then remove
    the folder.  A master already gone is nothing to close."""

    def exit_master(master: tuple[tuple[str, ...], str]) -> None:
        ssh, destination = master
        argv = [*ssh, "-o", f"ControlPath={where}/%C", "-O", "exit", destination]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=_CLOSE_TIMEOUT_S,
                check=False,
            )

    try:
        if any(where.iterdir()):
            _each(opened, exit_master)
    except OSError:
        pass
    shutil.rmtree(where, ignore_errors=True)


def _each(items: list[T], do: Callable[[T], None]) -> None:
    """``do`` each item at once (a box's server stop or master exit is a round trip of
    its own: the two ends' need not wait for each other), and wait for all."""
    with ThreadPoolExecutor(max(1, len(items)), "lnk-share-close") as pool:
        list(pool.map(do, items))
