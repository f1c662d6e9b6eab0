"""A relay from a host loopback port to a unix socket (into a sandbox's netns).

The sandboxed harness has a network namespace of its own with only ``lo``;
the host reaches it through a unix socket in ``~/.lnk/agents/.net/<id>/``,
which the sandbox binds at ``/run/lnk/net``.  Outside, :class:`TcpToUnixRelay`
listens on ``127.0.0.1:<endpoint port>`` and carries each TCP connection to
one connection on that socket, byte for byte, so a proof and the message that
follows it stay on one connection end to end.

Memory is bounded: one buffer of ``CHUNK`` bytes per direction per
connection, and at most ``max_connections`` connections at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import threading
from pathlib import Path

from lnk.errors import PortsUnavailable
from lnk.sandbox.unixsock import connect_unix

CHUNK = 64 * 1024
SPLICE_CHUNK = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# move pages rather than copy where the kernel can.  Never SPLICE_F_MORE: into a TCP
# socket it corks the last partial segment until more comes or 200 ms pass, so every
# answer's tail through the relay or the model proxy waited 200 ms (a status, which
# asks twice, took 0.41 s instead of 2 ms)
_FLAGS = getattr(os, "SPLICE_F_MOVE", 1)


def _splice(src: socket.socket, dst: socket.socket, counter: list[int] | None, idx: int) -> None:
    """Move bytes kernel-side through a pipe (no copy into Python), until EOF."""
    r, w = os.pipe()
    with contextlib.suppress(OSError):
        fcntl.fcntl(w, F_SETPIPE_SZ, SPLICE_CHUNK)  # fewer, larger moves (up to pipe-max-size)
    try:
        sfd, dfd = src.fileno(), dst.fileno()
        while True:
            n = os.splice(sfd, w, SPLICE_CHUNK, flags=_FLAGS)
            if n == 0:
                return
            left = n
            while left:
                left -= os.splice(r, dfd, left, flags=_FLAGS)
            if counter is not None:
                counter[idx] += n
    finally:
        os.close(r)
        os.close(w)


def _copy(src: socket.socket, dst: socket.socket, counter: list[int] | None, idx: int) -> None:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while True:
        n = src.recv_into(buf)
        if n == 0:
            return
        dst.sendall(view[:n])
        if counter is not None:
            counter[idx] += n


def pump(
    src: socket.socket,
    dst: socket.socket,
    counter: list[int] | None = None,
    idx: int = 0,
    *,
    half_close: bool = True,
) -> None:
    """Carry src's bytes to dst until src ends, then end dst's writing side.

    Plain sockets go through ``splice(2)`` where the system has it; the bytes
    carried are added to ``counter[idx]``.
    """
    try:
        if (
            hasattr(os, "splice")
            and type(src) is socket.socket
            and type(dst) is socket.socket
            and src.gettimeout() is None  # splice needs blocking sockets
            and dst.gettimeout() is None
        ):
            _splice(src, dst, counter, idx)
        else:
            _copy(src, dst, counter, idx)
    except (OSError, ValueError):
        pass
    finally:
        if half_close:
            with contextlib.suppress(OSError, ValueError):
                dst.shutdown(socket.SHUT_WR)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    pump(src, dst)


class TcpToUnixRelay:
    def __init__(
        self, port: int, unix_path: Path, *, host: str = "127.0.0.1", max_connections: int = 64
    ) -> None:
        self.host = host
        self.port = port
        self.unix_path = unix_path
        self._slots = threading.BoundedSemaphore(max_connections)
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self, *, listen_only: bool = False) -> None:
        """Listen, and carry connections (unless ``listen_only``: :meth:`serve` then does)."""
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            ls.bind((self.host, self.port))
        except OSError as e:
            ls.close()
            raise PortsUnavailable(
                f"the agent's endpoint port {self.host}:{self.port} is taken ({e})",
                hint="stop the program holding it, or restart the agent so it moves "
                "to a free block: lnk agent start",
            ) from e
        ls.listen(128)
        self.port = ls.getsockname()[1]
        self._listener = ls
        if not listen_only:
            self.serve()

    def serve(self) -> None:
        self._thread = threading.Thread(target=self._accept_loop, name="relay accept", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self._slots.acquire(blocking=False):
                client.close()  # too many at once: refuse rather than queue unbounded
                continue
            threading.Thread(
                target=self._carry, args=(client,), name="relay conn", daemon=True
            ).start()

    def _carry(self, client: socket.socket) -> None:
        inner = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connect_unix(inner, self.unix_path)
        except OSError as e:
            sys.stdout.write(f"lnk runner: relay: the sandbox's socket does not answer: {e}\n")
            sys.stdout.flush()
            inner.close()
            client.close()
            self._slots.release()
            return
        back = threading.Thread(target=_pump, args=(inner, client), daemon=True)
        back.start()
        _pump(client, inner)
        back.join()
        inner.close()
        client.close()
        self._slots.release()

    @property
    def listener(self) -> socket.socket | None:
        return self._listener

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)


HANDOFF = b"LNK-LISTEN 1\n"


def hand_over(relay: TcpToUnixRelay, unix_path: Path, timeout: float = 10.0) -> bool:
    """Hand the relay's listener to the proxy at ``unix_path`` (it then accepts the
    connections itself); True once it took it."""
    assert relay.listener is not None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        connect_unix(s, unix_path)
        socket.send_fds(s, [HANDOFF], [relay.listener.fileno()])
        answer = s.recv(64)
    except OSError:
        return False
    finally:
        s.close()
    return answer == b"OK\n"
