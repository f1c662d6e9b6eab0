"""The built-in harness's endpoint: HTTP/1.1 on loopback or on a unix socket.

    POST /_link/proof     {"challenge": b64}  ->  {"proof": b64}        (no key needed)
    POST /_link/message   Authorization: Bearer <b64 key>
                          {"thread": "link:main", "text": "hello"}
                          ->  {"thread", "text", "message", "number"}
    GET  /_link/status    Authorization: Bearer <b64 key>
                          ->  {"id", "owner", "name", "sandboxed"}
    POST /_link/unclaimed Authorization: Bearer <b64 key>
                          {"thread": "link:main"}  ->  {"answers": [{"number", "message",
                          "text", "answer"}]}: answers whose caller went, handed over once

A wrong or missing key is 401.  See ``docs/harness.md``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import select
import socket
import socketserver
import sys
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from lnk import logs
from lnk.agents.stores import open_agent_store
from lnk.bridges.proof import endpoint_proof
from lnk.errors import InvalidInput, LnkError
from lnk.harness.model import make_model
from lnk.harness.turns import Busy, Conversations, claim, mark_unclaimed

log = logs.get("harness")

MAX_BODY = 1 << 20
MAX_CHALLENGE = 1024


@dataclass
class HarnessConfig:
    """What the harness knows of its agent (written by the runner: no secrets)."""

    id: str
    name: str
    owner: str
    sandboxed: bool
    store: str
    chats: str
    renew_s: float = 10
    lapse_s: float = 60
    model: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> HarnessConfig:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        try:
            return cls(**data)
        except TypeError as e:
            raise InvalidInput(f"the harness config {path} is not valid: {e}") from e

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def read_key_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        key = f.read(1024)
    if not key:
        raise InvalidInput(
            f"the endpoint key file {path} is empty", hint="restart the agent: lnk agent start"
        )
    return key


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lnk-harness/1"
    server: Any

    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            # answers go out in two writes (head, body): don't let Nagle hold the second
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def address_string(self) -> str:  # a unix socket's peer has no address
        addr = self.client_address
        return str(addr[0]) if isinstance(addr, tuple) and addr else "unix"

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)
        sys.stdout.flush()

    # -- helpers -------------------------------------------------------------
    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str, hint: str | None = None) -> None:
        body: dict[str, Any] = {"error": message}
        if hint:
            body["hint"] = hint
        self._send(code, body)

    def _body(self) -> dict[str, Any] | None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            self._error(
                413 if length > MAX_BODY else 400,
                "the request body is too large or has no valid length",
            )
            return None
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            self._error(400, "the request body is not JSON")
            return None
        if not isinstance(body, dict):
            self._error(400, "the request body is not a JSON object")
            return None
        return body

    def _authorized(self) -> bool:
        auth = self.headers.get("Authorization", "")
        ok = False
        if auth.startswith("Bearer "):
            try:
                given = base64.b64decode(auth[7:].strip(), validate=True)
                ok = hmac.compare_digest(given, self.server.lnk_key)
            except (binascii.Error, ValueError):
                ok = False
        if not ok:
            self._error(
                401,
                "the endpoint key is missing or wrong",
                hint="restarting the agent makes a new key: read it again",
            )
        return ok

    # -- routes --------------------------------------------------------------
    def do_GET(self) -> None:
        if self.path != "/_link/status":
            self._error(404, f"no such route {self.path}")
            return
        if not self._authorized():
            return
        cfg: HarnessConfig = self.server.lnk_config
        self._send(
            200,
            {
                "id": cfg.id,
                "owner": cfg.owner,
                "name": cfg.name,
                "sandboxed": cfg.sandboxed,
                "pid": os.getpid(),
            },
        )

    def do_POST(self) -> None:
        if self.path == "/_link/proof":
            self._proof()
        elif self.path == "/_link/message":
            self._message()
        elif self.path == "/_link/unclaimed":
            self._unclaimed()
        else:
            self.close_connection = True
            self._error(404, f"no such route {self.path}")

    def _proof(self) -> None:
        body = self._body()
        if body is None:
            return
        try:
            challenge = base64.b64decode(str(body.get("challenge", "")), validate=True)
        except (binascii.Error, ValueError):
            self._error(400, "the challenge is not base64")
            return
        if not challenge or len(challenge) > MAX_CHALLENGE:
            self._error(400, "the challenge is empty or too long")
            return
        proof = endpoint_proof(self.server.lnk_key, challenge)
        self._send(200, {"proof": base64.b64encode(proof).decode()})

    def _message(self) -> None:
        if not self._authorized():
            self.close_connection = True
            return
        body = self._body()
        if body is None:
            return
        thread, text = body.get("thread", "link:main"), body.get("text")
        if not isinstance(thread, str) or not isinstance(text, str):
            self._error(400, "thread and text must be strings")
            return
        message_id = body.get("message_id")
        if message_id is not None and (
            not isinstance(message_id, str) or not message_id or len(message_id) > 100
        ):
            self._error(400, "message_id must be a short string")
            return
        convs: Conversations = self.server.lnk_conversations
        try:
            result = convs.handle(thread, text, message_id=message_id)
        except Busy as e:
            self._error(409, e.message, e.hint)
            return
        except LnkError as e:
            code = 400 if isinstance(e, InvalidInput) else 502
            self._error(code, e.message, e.hint)
            return
        repeated, number = bool(result.get("repeated")), int(result["number"])
        if not repeated and _peer_gone(self.connection):
            mark_unclaimed(convs, thread, number)  # Ctrl-C: kept for the thread's next chat
            return
        try:
            self._send(200, result)
        except OSError:
            if not repeated:
                mark_unclaimed(convs, thread, number)
            return
        if repeated:
            claim(convs, thread, only=number)  # its caller came back for it: handed over

    def _unclaimed(self) -> None:
        """``{"thread"}`` -> ``{"answers": [...]}``: the thread's answers whose caller went,
        handed over once (turns.claim)."""
        if not self._authorized():
            self.close_connection = True
            return
        body = self._body()
        if body is None:
            return
        thread = body.get("thread")
        if not isinstance(thread, str) or not thread or len(thread) > 200:
            self._error(400, "thread must be a short string")
            return
        self._send(200, {"answers": claim(self.server.lnk_conversations, thread)})


def _peer_gone(sock: socket.socket) -> bool:
    """Whether the caller closed its side (Ctrl-C) while its turn ran."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (OSError, ValueError):
        return True


class HarnessState:
    """What the handler reads from its server."""

    lnk_key: bytes
    lnk_config: HarnessConfig
    lnk_conversations: Conversations


class TCPHarnessServer(HarnessState, ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:  # no reverse DNS of 127.0.0.1
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class UnixHarnessServer(HarnessState, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def make_server(
    config: HarnessConfig,
    key: bytes,
    *,
    port: int | None = None,
    unix: Path | None = None,
    host: str = "127.0.0.1",
) -> TCPHarnessServer | UnixHarnessServer:
    store = open_agent_store(Path(config.chats), config.store, config.lapse_s)
    convs = Conversations(store, config.name, make_model(config.model), renew_s=config.renew_s)
    server: TCPHarnessServer | UnixHarnessServer
    if unix is not None:
        if unix.is_socket():
            unix.unlink()
        server = UnixHarnessServer(str(unix), Handler)
        os.chmod(unix, 0o600)
    elif port is not None:
        server = TCPHarnessServer((host, port), Handler)
    else:
        raise InvalidInput("the harness needs --port or --unix")
    server.lnk_key = key
    server.lnk_config = config
    server.lnk_conversations = convs
    return server


def probe_connect(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether a TCP connection to host:port can be made (the sandbox test's probe)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
