"""One lnk process per box for a whole move: its steps forked from it, not started.

A move runs some twenty ``lnk`` steps at a box, and each start of a Python ``lnk``
imports the whole program (about 0.5 s on a small box, more than most steps'
work).  Inside a :func:`lnk.transport.share.shared` block, the first step at a
leg starts ``lnk box serve`` there: a daemon that has imported everything and
listens on a unix socket in a new private folder (mode 0700).  Every later step
runs as

    <the box's lnk> --served-by SOCKET ARGS...

which imports almost nothing: it hands the server its stdin, stdout and stderr
(``SCM_RIGHTS``), its arguments, environment, umask and working folder, and
waits.  The server forks; the child takes those as its own and runs ``lnk
ARGS`` exactly as a started process would (same descriptors: a broken pipe or
an end of input reaches it as before), and its exit status comes back to the
caller, which exits the same way (killed by a signal: by the same signal).  A
signal sent to the caller (INT, TERM, HUP) is passed on to the child; a caller
that vanishes (kill -9) hangs its child up (SIGHUP), as an SSH session's end
would.

If the socket does not answer (no server: an older box, one that timed out or
was killed), the step runs in place as plain ``lnk``: slower, never different.

A caller need not be ``lnk`` at all: a server says in its answer (``caller``) how to
run this file as a script, with the Python serving, isolated and without its site
packages (``python -I -S .../served.py``: about 8 ms where ``lnk --served-by``
takes 35, most of it the site packages' start)::

    <python> -I -S <this file> SOCKET FALLBACK ARGS...

``FALLBACK`` is the shell line of the place's own ``lnk``: if no server answers, it
is run with ``ARGS`` in the caller's place (``sh -c 'FALLBACK "$@"'``), as the step
would have run without a server.

Only the server's own user may call it: the folder is 0700 and, where the
system says who is on the other end (``SO_PEERCRED``), another user's call is
closed unanswered.  The server ends on ``lnk box serve --stop`` run through it,
on SIGTERM, or after :data:`lnk.transport.server.IDLE_S` with no step, and removes
its folder (:mod:`lnk.transport.server`).

The wire, in both directions on one connection:

* request: ``LNKS`` + 4-byte big-endian length + that many bytes of JSON
  ``{"argv": [...], "env": {...}, "cwd": "...", "umask": N}``, the three
  descriptors attached to the first byte;
* answers: ``pid N`` from the step once it runs, ``exit N`` from the step as it
  ends, and from the server once it ended ``exit N`` or ``signal N`` (a signal
  killed it): the first status line counts, so a step whose server was killed
  meanwhile still tells how it ended.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from typing import NoReturn

MAGIC = b"LNKS"
HEAD = struct.Struct(">4sI")
"""A request's start: the magic and the length of the JSON that follows."""


_PASSED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def caller() -> tuple[str, ...] | None:
    """How a step calls a server started by this Python without importing lnk: this file
    as a script, ``-I`` (neither its folder nor ``PYTHON*`` variables on the way, so no
    module beside it shadows the standard library's) and ``-S`` (no site packages); None
    where this Python or file cannot be named (then steps call ``lnk --served-by``)."""
    exe, here = sys.executable, os.path.abspath(__file__)
    if not exe or not os.path.isabs(exe) or not here.endswith(".py") or not os.path.isfile(here):
        return None
    return (exe, "-I", "-S", here)


def main(argv: list[str]) -> NoReturn:
    """``served.py SOCKET FALLBACK ARGS...``: the step ``lnk ARGS`` through the server at
    SOCKET, or, when none answers, the shell line FALLBACK with ARGS in this process's
    place (exec: the same input, output, signals and exit status)."""
    if len(argv) < 2:
        sys.stderr.write("lnk: error: usage: served.py SOCKET FALLBACK [ARGS...]\n")
        sys.exit(2)
    path, fallback, args = argv[0], argv[1], argv[2:]
    call(path, args)
    try:
        os.execv("/bin/sh", ["sh", "-c", fallback + ' "$@"', "sh", *args])
    except OSError as err:
        sys.stderr.write(f"lnk: error: cannot run this machine's lnk: {err.strerror}\n")
        sys.exit(127)


def call(path: str, args: list[str]) -> None:
    """Run ``lnk ARGS`` in the server at ``path`` and exit as it did; return (having done
    nothing) when no server answers, so the caller runs the step itself."""
    step = _Signals()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = "/"
        umask = os.umask(0o022)
        os.umask(umask)
        body = json.dumps(
            {"argv": args, "env": dict(os.environ), "cwd": cwd, "umask": umask}
        ).encode("utf-8", "surrogateescape")
        fds = array.array("i", [0, 1, 2])
        conn.sendmsg([HEAD.pack(MAGIC, len(body))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        conn.sendall(body)
        answers = conn.makefile("rb")
        first = answers.readline(64)
    except OSError:
        first = b""
    if not first:  # no server took it, or it closed unanswered: nothing ran
        conn.close()
        step.run_here()
        return
    if not first.startswith(b"pid "):
        _exit_as(first)  # it ended before it could say its pid
    try:
        step.reach(int(first[4:]))
    except ValueError:
        _exit_as(b"")
    # the step holds our input and output now: let go of them, so an end of input or
    # of output is the step's alone, as for a started process (stderr stays: the
    # line below, if the server ends first)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    try:
        last = answers.readline(64)
    except OSError:
        last = b""
    _exit_as(last)


class _Signals:
    """INT, TERM and HUP for the step: passed on once its pid is known, held until then
    (and raised here again if the step runs here after all)."""

    def __init__(self) -> None:
        self.pid = 0
        self.held: list[int] = []
        self.before = {s: signal.signal(s, self._on) for s in _PASSED}

    def _on(self, signum: int, _frame: object) -> None:
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signum)
        else:
            self.held.append(signum)

    def reach(self, pid: int) -> None:
        self.pid = pid
        for s in self.held:
            with contextlib.suppress(OSError):
                os.kill(pid, s)

    def run_here(self) -> None:
        for passed, handler in self.before.items():
            signal.signal(passed, handler)
        for held in self.held:
            signal.raise_signal(held)


def _exit_as(last: bytes) -> NoReturn:
    word, _, number = last.strip().partition(b" ")
    if word == b"exit" and number.isdigit():
        sys.exit(int(number))
    if word == b"signal" and number.isdigit():
        sig = int(number)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), sig)
        time.sleep(1)  # a signal whose default is not to end: exit as a failure
    sys.stderr.write("lnk: error: this machine's lnk server ended before the step's status\n")
    sys.exit(1)


if __name__ == "__main__":  # run as a script (caller()), importing no module of lnk's
    main(sys.argv[1:])
