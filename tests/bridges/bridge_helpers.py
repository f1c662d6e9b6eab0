"""Helpers for the bridge tests: a recording handler and a raw protocol client."""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk.bridges.proof import bridge_proof
from lnk.bridges.server import BridgeServer, Call

AGENT = "agent-1"
OWNER = "alice"
WAIT = 10.0  # the most a test waits for the server to do something


class Recorder:
    """Handlers that remember each call they were given."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lock = threading.Lock()

    def echo(self, call: Call) -> dict[str, Any]:
        with self.lock:
            self.calls.append(call)
        return {"echo": call.body, "agent": call.agent_id, "uid": call.peer_uid}


OPEN: list[socket.socket] = []
"""Every raw client's socket, closed by a fixture after each test."""


class Raw:
    """A client speaking the protocol by hand, line by line."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        OPEN.append(self.sock)
        self.sock.settimeout(WAIT)
        self.sock.connect(str(path))
        self.buf = b""

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, obj: Any) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def line(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"closed before a line; had {self.buf!r}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        obj = json.loads(line)
        assert isinstance(obj, dict)
        return obj

    def error_code(self) -> str:
        answer = self.line()
        assert answer["ok"] is False, answer
        assert set(answer) == {"ok", "error"} and set(answer["error"]) == {"code", "message"}
        assert answer["error"]["message"]
        return str(answer["error"]["code"])

    def closed(self) -> bool:
        """Wait (bounded) for the server to close; True once it has."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def prove(
        self,
        key: bytes,
        agent: str = AGENT,
        owner: str = OWNER,
        action: str = "echo",
        body: Any = None,
    ) -> dict[str, Any]:
        """Finish a call whose hello was sent already: read the challenge, send the proof."""
        challenge = base64.b64decode(self.line()["challenge"])
        proof = bridge_proof(key, agent, owner, action, challenge)
        self.send({"proof": base64.b64encode(proof).decode(), "body": body or {}})
        return self.line()

    def close(self) -> None:
        self.sock.close()


def hello(action: str = "echo", agent: str = AGENT, owner: str = OWNER) -> dict[str, str]:
    return {"agent": agent, "owner": owner, "action": action}


ServerFactory = Callable[..., BridgeServer]
