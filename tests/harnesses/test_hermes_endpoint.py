"""lnk-hermes's endpoint as any client meets it: lnk's own client (the proof, then the
key) and hostile requests, each refused with its status, never a hung or dropped one."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk.errors import Refused
from lnk.harness.client import status


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    home = tmp_path / "harness"
    (home / ".lnk").mkdir(parents=True)
    agent = {"id": "ag-x", "name": "work", "owner": "local-x", "sandboxed": False}
    (home / ".lnk" / "agent.json").write_text(json.dumps(agent))
    key = b"k" * 32
    (tmp_path / "key").write_bytes(key)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lnk_hermes.serve", "--home", str(home), "--hermes",
         "/bin/false", "--key-file", str(tmp_path / "key"), "--port", str(port)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert b"answers at" in proc.stdout.readline()  # it listens
    try:
        yield port, key
    finally:
        proc.terminate()
        proc.wait(30)


def _ask(port: int, method: str, path: str, body: bytes, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_lnk_s_client_proves_the_endpoint_and_refuses_another_key(
    endpoint: tuple[int, bytes],
) -> None:
    port, key = endpoint
    st = status(port, key)
    assert (st["id"], st["name"], st["harness"]) == ("ag-x", "work", "hermes")
    with pytest.raises(Refused, match="could not prove it holds"):
        status(port, b"another key entirely, 32 bytes!")


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "code"),
    [
        ("POST", "/_link/message", b'{"thread": "t", "text": "x"}', {}, 401),
        ("GET", "/_link/status", b"", {"Authorization": "Bearer d3Jvbmc="}, 401),
        ("POST", "/_link/proof", b"{}", {"Content-Length": "-5"}, 400),
        ("POST", "/_link/proof", b"{", {}, 400),
        ("POST", "/_link/proof", b'{"challenge": "!!"}', {}, 400),
        ("POST", "/_link/proof", json.dumps({"challenge": "QQ==" * 400}).encode(), {}, 400),
        ("POST", "/_link/proof", b"x" * (2 << 20), {}, 413),
    ],
    ids=["no-key", "wrong-key", "negative-length", "not-json", "not-base64", "long", "huge"],
)
def test_hostile_requests_are_refused_with_their_status(
    endpoint: tuple[int, bytes],
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    code: int,
) -> None:
    port, _ = endpoint
    assert _ask(port, method, path, body, headers) == code


def test_a_failed_turn_is_a_502_naming_hermes(endpoint: tuple[int, bytes]) -> None:
    port, key = endpoint
    from lnk.errors import LnkError
    from lnk.harness.client import send_message

    with pytest.raises(LnkError, match="HTTP 502: Hermes's turn failed"):
        send_message(port, key, "link:main", "hello")  # its Hermes is /bin/false
