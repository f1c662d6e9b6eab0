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
from collections.abc import Iterator
from pathlib import Path

PERSIST_S = 30
"""How long an idle master lives on when lnk did not close it (lnk was killed)."""

_CLOSE_TIMEOUT_S = 10.0

_lock = threading.Lock()
_folder: Path | None = None
_depth = 0
_opened: set[tuple[tuple[str, ...], str]] = set()


def enabled() -> bool:
    """Whether sharing is on (``LNK_SSH_SHARE`` is not ``0``)."""
    return os.environ.get("LNK_SSH_SHARE", "1").strip() != "0"


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


def _private_folder() -> Path:
    """A new 0700 folder for the sockets, with a short path (a socket's path is at most
    about 100 bytes): under ``XDG_RUNTIME_DIR`` when it is there, else /tmp."""
    run = os.environ.get("XDG_RUNTIME_DIR", "")
    base = run if run and len(run) <= 40 and os.path.isdir(run) else "/tmp"
    return Path(tempfile.mkdtemp(prefix="lnk-ssh-", dir=base if os.path.isdir(base) else None))


@contextlib.contextmanager
def shared() -> Iterator[Path | None]:
    """Share one connection per box among the ssh commands run inside (nested blocks
    join the outermost); every master opened is closed when the outermost ends."""
    global _folder, _depth
    if not enabled():
        yield None
        return
    with _lock:
        _depth += 1
        if _folder is None:
            _folder = _private_folder()
        mine = _folder
    try:
        yield mine
    finally:
        with _lock:
            _depth -= 1
            last = _depth == 0
            if last:
                _folder = None
                opened = sorted(_opened)
                _opened.clear()
        if last:
            close(mine, opened)


def close(where: Path, opened: list[tuple[tuple[str, ...], str]]) -> None:
    """Close every master whose socket is in ``where`` (``ssh -O exit``), then remove
    the folder.  A master already gone is nothing to close."""
    try:
        if any(where.iterdir()):
            for ssh, destination in opened:
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
    except OSError:
        pass
    shutil.rmtree(where, ignore_errors=True)
