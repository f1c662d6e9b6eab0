"""The TCP-to-unix-socket relay, byte for byte, one connection for one."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk.errors import PortsUnavailable
from lnk.sandbox.relay import TcpToUnixRelay
from lnk.sandbox.unixsock import connect_unix


@pytest.fixture
def echo_sock(tmp_path: Path) -> Iterator[tuple[Path, list[int]]]:
    """A unix echo server that also counts its connections."""
    path = tmp_path / "e.sock"
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(str(path))
    ls.listen(8)
    conns: list[int] = []

    def serve(c: socket.socket) -> None:
        with c:
            while data := c.recv(65536):
                c.sendall(data)

    def accept() -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            conns.append(1)
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield path, conns
    ls.shutdown(socket.SHUT_RDWR)
    ls.close()


def test_relay_carries_bytes_both_ways(echo_sock: tuple[Path, list[int]]) -> None:
    path, conns = echo_sock
    relay = TcpToUnixRelay(0, path)
    relay.start()
    try:
        payload = os.urandom(3 << 20)
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as c:

            def send() -> None:
                c.sendall(payload)
                c.shutdown(socket.SHUT_WR)

            t = threading.Thread(target=send)
            t.start()
            h = hashlib.sha256()
            got = 0
            while data := c.recv(65536):
                h.update(data)
                got += len(data)
            t.join()
        assert got == len(payload) and h.digest() == hashlib.sha256(payload).digest()
        assert len(conns) == 1
    finally:
        relay.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", relay.port), timeout=5)


def test_relay_refuses_a_taken_port(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        with pytest.raises(PortsUnavailable):
            TcpToUnixRelay(holder.getsockname()[1], tmp_path / "x.sock").start()
    finally:
        holder.close()


def test_relay_closes_when_the_inside_is_gone(tmp_path: Path) -> None:
    relay = TcpToUnixRelay(0, tmp_path / "nobody.sock")
    relay.start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as c:
            assert c.recv(10) == b""
    finally:
        relay.stop()


def test_a_link_planted_in_the_net_folder_is_not_followed(
    echo_sock: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """The sandbox writes its net folder: a link there to another agent's socket leads the
    relay nowhere (issue 22), and a socket swapped back in is reached again."""
    other, conns = echo_sock  # another agent's endpoint
    net = tmp_path / "net"
    net.mkdir()
    (net / "endpoint.sock").symlink_to(other)
    relay = TcpToUnixRelay(0, net / "endpoint.sock")
    relay.start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as c:
            c.sendall(b"status?")
            c.settimeout(10)
            try:
                got = c.recv(100)
            except ConnectionResetError:
                got = b""
            assert got == b""  # closed: nothing answered
        assert conns == []  # the other agent's socket was never reached
        with pytest.raises(OSError):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connect_unix(s, net / "endpoint.sock")
        # the real socket (not a link) is reached as before
        (net / "endpoint.sock").unlink()
        os.rename(other, net / "endpoint.sock")
        with socket.create_connection(("127.0.0.1", relay.port), timeout=10) as c:
            c.sendall(b"ping")
            assert c.recv(100) == b"ping"
        assert conns == [1]
    finally:
        relay.stop()


def test_nothing_is_corked_on_the_way_out(
    echo_sock: tuple[Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every splice says nothing more is coming (no SPLICE_F_MORE): into a TCP socket that
    flag holds an answer's last partial segment back until the kernel's 200 ms timer, so
    each small answer through the relay or the model proxy would wait that long."""
    from lnk.sandbox import relay as relay_mod

    flags: list[int] = []
    real = os.splice

    def spy(src: int, dst: int, count: int, *args: object, **kw: object) -> int:
        flags.append(int(kw.get("flags", 0)))  # type: ignore[call-overload]
        return real(src, dst, count, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(relay_mod.os, "splice", spy)
    path, _ = echo_sock
    relay = TcpToUnixRelay(0, path)
    relay.start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as c:
            for word in (b"head\r\n", b"body"):
                c.sendall(word)
                got = b""
                while len(got) < len(word):
                    got += c.recv(64)
                assert got == word
    finally:
        relay.stop()
    assert flags, "the relay did not splice"
    assert not [f for f in flags if f & getattr(os, "SPLICE_F_MORE", 4)]
