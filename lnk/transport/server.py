"""The lnk server of :mod:`lnk.transport.served`: a daemon that forks a move's steps.

:func:`start` binds the socket in a new private folder, then forks the daemon (its
own session, nothing of the command that started it held open) and returns once
it listens.  The daemon takes one request at a time (:func:`_take`: this user's
only, three descriptors and the JSON) and forks the step, which answers ``pid N``
itself, becomes its caller (:func:`_become`), runs ``lnk ARGS`` through the
function it was given and answers ``exit N`` as it ends; once it ended the server
answers too (``exit N``, or ``signal N`` for a step a signal killed), so a caller
learns how its step ended even if one of the two is gone.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from lnk.transport import share
from lnk.transport.served import HEAD, MAGIC

IDLE_S = 60.0
"""A server with no step for this long ends (its mover was killed): a move's steps
follow each other within seconds, and a step after it simply runs alone."""

MAX_REQUEST = 4 << 20
"""The most bytes a request's JSON may hold (an environment of a few KiB, in practice)."""

PREFIX = "lnk-serve-"
SOCKET_NAME = "s"
_READ_TIMEOUT_S = 10.0  # a caller takes this long at most to send its request

_SERVER_PID: int | None = None  # in a step the server forked: the server's pid
_CALLER: socket.socket | None = None  # in a step: the connection to its caller


class _Step:
    """What one caller asked for, and the connection its status goes back on."""

    def __init__(self, conn: socket.socket, fds: list[int], doc: dict[str, Any]) -> None:
        self.conn, self.fds = conn, fds
        argv, env = doc.get("argv"), doc.get("env")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv is not a list of texts")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError("env is not a map of texts")
        self.argv: list[str] = argv
        self.env: dict[str, str] = env
        self.cwd = str(doc.get("cwd") or "/")
        umask = doc.get("umask", 0o022)
        self.umask = umask if isinstance(umask, int) and 0 <= umask <= 0o777 else 0o022


def start(run: Callable[[list[str]], object], idle_s: float = IDLE_S) -> tuple[str, int]:
    """Start the server as a daemon; returns its socket's path and pid once it listens.

    In the daemon this never returns: it serves until told to stop; in a step it
    forked, ``run(argv)`` runs ``lnk ARGV`` (and exits through :class:`SystemExit`,
    which unwinds the daemon's frames as in a plain process: ``atexit`` handlers and
    buffered output run as they would)."""
    base = share.socket_base()
    _sweep(base)
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
    path = str(folder / SOCKET_NAME)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        listener.close()
        return path, pid
    # the daemon: its own session, nothing of the command that started it held open
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        step = _serve(listener, folder, idle_s)
    except BaseException:
        _cleanup(folder)
        os._exit(1)
    if step is None:
        _cleanup(folder)
        os._exit(0)
    _become(step)
    try:
        run(step.argv)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:  # as the interpreter ends on one: by the signal
        _finish(0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    _finish(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> NoReturn:
    """End a step as the interpreter would (its threads joined, ``atexit`` run, output
    flushed) without tearing the whole inherited heap down object by object: that
    touches every page the server shares with the step, and cost 60-100 ms a step."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # what the interpreter does first: wait for non-daemon threads
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            f.flush()
    if _CALLER is not None:  # told by the step itself, so a server killed meanwhile
        with contextlib.suppress(OSError):  # loses no finished step's status
            _CALLER.sendall(b"exit %d\n" % code)
    os._exit(code)


def _sweep(base: Path) -> None:
    """Remove this user's server folders whose server is gone (killed: it could not)."""
    try:
        found = [p for p in base.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return
    for folder in found:
        try:
            if folder.is_symlink() or folder.lstat().st_uid != os.getuid():
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(folder / SOCKET_NAME))
        except ConnectionRefusedError:
            _cleanup(folder)  # a socket no server listens on
        except FileNotFoundError:
            _cleanup(folder)  # an empty folder (rmdir leaves anything else alone)
        except OSError:
            continue


def server_pid() -> int | None:
    """In a step the server forked, the server's pid (else None)."""
    return _SERVER_PID


def _cleanup(folder: Path) -> None:
    with contextlib.suppress(OSError):
        (folder / SOCKET_NAME).unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _serve(listener: socket.socket, folder: Path, idle_s: float) -> _Step | None:
    """Take steps until stopped or idle: None in the server, the step in a forked child."""
    me = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    stopping = [False]

    def on_stop(_signum: int, _frame: object) -> None:
        stopping[0] = True

    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGHUP, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.set_wakeup_fd(wake_w)
    gc.freeze()  # what is imported stays out of every step's collections: shared, not copied
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    running: dict[int, socket.socket] = {}
    last = time.monotonic()
    listening = True
    while True:
        if stopping[0] and listening:  # callers from now on find no server: they run alone
            sel.unregister(listener)
            listener.close()
            listening = False
            _cleanup(folder)  # before the stopping step's status goes back: gone by then
        _reap(running)
        if running:
            last = time.monotonic()
            timeout: float | None = None
        else:
            timeout = last + idle_s - time.monotonic()
            if stopping[0] or timeout <= 0:
                break
        for key, _ in sel.select(timeout):
            if key.fileobj is listener and listening:
                step = _take(listener)
                if step is None:
                    continue
                last = time.monotonic()
                pid = os.fork()
                if pid == 0:  # the step: shed the server's descriptors
                    signal.set_wakeup_fd(-1)
                    for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
                        signal.signal(s, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    sel.close()
                    listener.close()  # listening: a step is taken only then
                    os.close(wake_r)
                    os.close(wake_w)
                    for other in running.values():
                        other.close()
                    global _SERVER_PID
                    _SERVER_PID = me
                    return step
                for fd in step.fds:
                    os.close(fd)
                running[pid] = step.conn  # the step tells its pid; this, how it ended
            elif key.fileobj == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
    sel.close()
    if listening:
        listener.close()
    return None


def _reap(running: dict[int, socket.socket]) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        line = b"signal %d\n" % -code if code < 0 else b"exit %d\n" % code
        with contextlib.suppress(OSError):
            conn.sendall(line)
        conn.close()


def _take(listener: socket.socket) -> _Step | None:
    """Accept one caller and read its request; None (the connection closed) for a caller
    that is not this user, or a request that is not one."""
    try:
        conn, _ = listener.accept()
    except OSError:
        return None
    fds: list[int] = []
    try:
        if hasattr(socket, "SO_PEERCRED"):
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                raise ValueError("another user")
        conn.settimeout(_READ_TIMEOUT_S)
        head, anc, _flags, _addr = conn.recvmsg(HEAD.size, socket.CMSG_SPACE(3 * 4))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(data[: len(data) - len(data) % got.itemsize])
                fds.extend(got)
        if len(head) < HEAD.size:
            head += _read_exactly(conn, HEAD.size - len(head))
        magic, size = HEAD.unpack(head)
        if magic != MAGIC or size > MAX_REQUEST or len(fds) != 3:
            raise ValueError("not a request")
        doc = json.loads(_read_exactly(conn, size).decode("utf-8", "surrogateescape"))
        if not isinstance(doc, dict):
            raise ValueError("not a request")
        conn.settimeout(None)
        return _Step(conn, fds, doc)
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return None


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        part = conn.recv(min(n - len(out), 1 << 16))
        if not part:
            raise ValueError("the request ended early")
        out += part
    return bytes(out)


def _become(step: _Step) -> None:
    """In the forked child: take the caller's descriptors, environment, folder and umask."""
    for fd, target in zip(step.fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
    for fd in set(step.fds) - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(step.env)
    tempfile.tempdir = None  # chosen again from this environment
    os.umask(step.umask)
    try:
        os.chdir(step.cwd)
    except OSError:
        os.chdir("/")
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
    sys.argv = ["lnk", *step.argv]
    global _CALLER
    _CALLER = step.conn
    with contextlib.suppress(OSError):  # first: the server writes only once this ended
        step.conn.sendall(b"pid %d\n" % os.getpid())
    threading.Thread(target=_hang_up_when_gone, args=(step.conn,), daemon=True).start()


def _hang_up_when_gone(conn: socket.socket) -> None:
    """The caller sends nothing after its request: its end closing means it is gone."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGHUP)
