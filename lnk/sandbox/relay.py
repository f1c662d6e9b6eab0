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
import socket
import sys
import threading
from pathlib import Path

from lnk.errors import PortsUnavailable
from lnk.sandbox.unixsock import connect_unix

CHUNK = 64 * 1024


def _pump(src: socket.socket, dst: socket.socket) -> None:
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    try:
        while True:
            n = src.recv_into(buf)
            if n == 0:
                break
            dst.sendall(view[:n])
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


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

    def start(self) -> None:
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
        ls.listen(64)
        self.port = ls.getsockname()[1]
        self._listener = ls
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

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
