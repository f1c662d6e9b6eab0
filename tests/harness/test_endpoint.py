"""The built-in harness through its runner, unsandboxed: real processes on loopback."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from lnk.agents.stores import store_path
from lnk.collections import CollectionId, open_store
from lnk.errors import AgentNotRunning, Refused
from lnk.harness import client


def events(agent: Any, thread: str = "link:main") -> list[dict[str, Any]]:
    s = agent.settings
    with open_store(s.store, store_path(agent.folders.chats, s.store)) as store:
        return [e.data for e in store.read(CollectionId("events", thread))]


@pytest.mark.parametrize("store", ["files", "sqlite"])
def test_messages_are_answered_and_kept_in_order(start_agent: Any, store: str) -> None:
    r = start_agent("main", store=store)
    assert r.endpoint["sandboxed"] is False
    assert r.endpoint["port"] == r.agent.settings.endpoint_port
    a1 = client.send_message(r.port, r.key, "link:main", "hello", timeout=30)
    a2 = client.send_message(r.port, r.key, "link:main", "again", timeout=30)
    a3 = client.send_message(r.port, r.key, "link:other", "elsewhere", timeout=30)
    assert a1 == "[main] you said: hello (message 1 in link:main)"
    assert a2 == "[main] you said: again (message 2 in link:main)"
    assert a3 == "[main] you said: elsewhere (message 1 in link:other)"
    evs = events(r.agent)
    assert [(e["type"], e["text"]) for e in evs] == [
        ("message", "hello"),
        ("answer", a1),
        ("message", "again"),
        ("answer", a2),
    ]
    assert evs[1]["reply_to"] == 1 and evs[3]["reply_to"] == 3
    assert [e["text"] for e in events(r.agent, "link:other")] == ["elsewhere", a3]


def test_status_names_the_agent(start_agent: Any) -> None:
    r = start_agent("helper")
    st = client.status(r.port, r.key, timeout=30)
    s = r.agent.settings
    assert (st["id"], st["owner"], st["name"], st["sandboxed"]) == (s.id, s.owner, "helper", False)


def test_key_file_is_private_and_fresh_each_start(start_agent: Any) -> None:
    r = start_agent("main")
    key_path = r.agent.runtime / "key"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(r.agent.runtime.stat().st_mode) == 0o700
    first = r.key
    assert len(first) == 32
    assert r.stop() == 0
    assert not key_path.exists() and not (r.agent.runtime / "endpoint.json").exists()
    r2 = start_agent(agent=r.agent)
    assert r2.key != first
    with pytest.raises(Refused):  # the old key can't even verify the new endpoint's proof
        client.send_message(r2.port, first, "link:main", "hi", timeout=30)


def _raw(
    port: int, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str]
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def test_wrong_or_missing_key_is_401(start_agent: Any) -> None:
    r = start_agent("main")
    wrong = {"Authorization": "Bearer " + base64.b64encode(b"x" * 32).decode()}
    msg = {"thread": "link:main", "text": "let me in"}
    assert _raw(r.port, "POST", "/_link/message", msg, wrong)[0] == 401
    assert _raw(r.port, "POST", "/_link/message", msg, {})[0] == 401
    assert _raw(r.port, "POST", "/_link/message", msg, {"Authorization": "Bearer !!"})[0] == 401
    assert _raw(r.port, "GET", "/_link/status", None, wrong)[0] == 401
    assert events(r.agent) == []
    good = {"Authorization": "Bearer " + base64.b64encode(r.key).decode()}
    code, body = _raw(r.port, "POST", "/_link/message", msg, good)
    assert code == 200 and body["text"].endswith("let me in (message 1 in link:main)")


def test_proof_answers_any_challenge_without_the_key(start_agent: Any) -> None:
    from lnk.bridges.proof import verify_endpoint_proof

    r = start_agent("main")
    challenge = os.urandom(32)
    code, body = _raw(
        r.port, "POST", "/_link/proof", {"challenge": base64.b64encode(challenge).decode()}, {}
    )
    assert code == 200
    assert verify_endpoint_proof(r.key, challenge, base64.b64decode(body["proof"]))
    assert _raw(r.port, "POST", "/_link/proof", {"challenge": "%%%"}, {})[0] == 400


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        type(self).seen.append((self.path, dict(self.headers.items())))
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        data = json.dumps(
            {"proof": base64.b64encode(os.urandom(32)).decode(), "text": "gotcha"}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_POST = _answer
    do_GET = _answer


@pytest.fixture
def impostor() -> Iterator[tuple[int, list[tuple[str, dict[str, str]]]]]:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server.server_address[1], _Recorder.seen
    server.shutdown()
    server.server_close()


def test_impostor_on_the_port_never_gets_the_key(impostor: Any) -> None:
    port, seen = impostor
    key = os.urandom(32)
    with pytest.raises(Refused) as ei:
        client.send_message(port, key, "link:main", "secret plans", timeout=10)
    assert f"something else answers on port {port}" in ei.value.message
    with pytest.raises(Refused):
        client.status(port, key, timeout=10)
    assert [path for path, _ in seen] == ["/_link/proof", "/_link/proof"]
    for _, headers in seen:
        assert not any(h.lower() == "authorization" for h in headers)
        assert base64.b64encode(key).decode() not in json.dumps(headers)


def test_an_answer_cut_short_is_an_endpoint_gone_not_an_impostor() -> None:
    """An endpoint that stops in the middle of its proof's answer (its length says more
    than comes before the connection closes) is not running, not something else on the
    port: a message sent during a move's pause is then held, not refused."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def answer_half() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\n\r\n" + b'{"proof": "')

    t = threading.Thread(target=answer_half, daemon=True)
    t.start()
    try:
        with pytest.raises(AgentNotRunning, match="the connection failed"):
            client.send_message(port, os.urandom(32), "link:main", "hi", timeout=10)
    finally:
        t.join(timeout=10)
        listener.close()


def test_nothing_on_the_port_is_not_running() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(AgentNotRunning) as ei:
        client.send_message(port, os.urandom(32), "link:main", "hi", timeout=5)
    assert "lnk agent start" in (ei.value.hint or "")


def test_runner_reports_the_harness_dying(start_agent: Any) -> None:
    r = start_agent("main")
    os.kill(r.endpoint["harness_pid"], signal.SIGKILL)
    code = r.proc.wait(timeout=30)
    assert code != 0
    exit_info = json.loads((r.agent.runtime / "exit.json").read_text())
    assert exit_info["code"] == -signal.SIGKILL
    assert "exited" in exit_info["reason"] and exit_info["at"]
    with pytest.raises(AgentNotRunning):
        client.send_message(r.port, os.urandom(32), "link:main", "hi", timeout=5)


def test_machine_that_forbids_unsandboxed_refuses(start_agent: Any, home: Any) -> None:
    (home / ".lnk").mkdir(parents=True, exist_ok=True)
    (home / ".lnk" / "machine.toml").write_text('id = "m-abc"\nunsandboxed = false\n')
    with pytest.raises(AgentNotRunning) as ei:
        start_agent("main", sandbox=False)
    assert "unsandboxed = false" in ei.value.message
