"""``python -m lnk_hermes.serve``: Hermes at the agent's endpoint, speaking lnk's endpoint
protocol (lnk's docs/harness.md): the proof first, then the keyed request.

Each message is one Hermes turn, ``hermes chat -Q -q TEXT --resume SESSION``, so
Hermes keeps its own sessions and messages in its ``state.db`` as ever.  lnk's
thread maps to one Hermes session (``lnk/threads.json`` in Hermes's home), and an
answer is kept by its message ID (``lnk/answers.json``), so a message sent again
(a move's held message, a caller that came back) is answered once.  One turn per
thread at a time.  ``/_link/unclaimed`` answers 404: this endpoint keeps none.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import socketserver
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ENDPOINT_LABEL = b"lnk endpoint proof v1\0"
MAX_BODY = 1 << 20
TURN_TIMEOUT_S = 600.0
WAIT_TURN_S = 60.0
STOP_WAIT_S = 60.0  # a stop lets a running turn end (lnk's runner waits 70 s)
KEEP_ANSWERS = 1000
SESSION_RE = re.compile(r"session_id:\s*(\S+)")


class Store:
    """The endpoint's own files in Hermes's home: threads and answers, written atomically."""

    def __init__(self, home: Path) -> None:
        self.dir = home / "lnk"
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.lock = threading.Lock()
        self.thread_locks: dict[str, threading.Lock] = {}

    def _load(self, name: str) -> dict[str, Any]:
        try:
            doc = json.loads((self.dir / name).read_text())
            return doc if isinstance(doc, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self, name: str, doc: dict[str, Any]) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, self.dir / name)

    def thread_lock(self, thread: str) -> threading.Lock:
        with self.lock:
            return self.thread_locks.setdefault(thread, threading.Lock())

    def session(self, thread: str) -> dict[str, Any]:
        with self.lock:
            row = self._load("threads.json").get(thread)
            return row if isinstance(row, dict) else {}

    def answered(self, message_id: str) -> dict[str, Any] | None:
        with self.lock:
            row = self._load("answers.json").get(message_id)
            return row if isinstance(row, dict) else None

    def record(
        self, thread: str, session: str, message_id: str | None, answer: dict[str, Any]
    ) -> None:
        with self.lock:
            threads = self._load("threads.json")
            threads[thread] = {"session": session, "count": answer["number"]}
            self._save("threads.json", threads)
            if message_id:
                answers = self._load("answers.json")
                answers[message_id] = answer
                for old in list(answers)[: max(0, len(answers) - KEEP_ANSWERS)]:
                    del answers[old]
                self._save("answers.json", answers)


class Failure(Exception):
    def __init__(self, code: int, error: str, hint: str = "") -> None:
        super().__init__(error)
        self.code, self.error, self.hint = code, error, hint


class Hermes:
    def __init__(self, program: str, home: Path) -> None:
        self.program = program
        self.home = home
        self.agent = json.loads((home / ".lnk" / "agent.json").read_text())
        self.store = Store(home)
        self.running = 0  # turns under way: a stop lets them end (STOP_WAIT_S)
        self.idle = threading.Condition()

    def wait_idle(self, timeout: float) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.running == 0, timeout)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["HERMES_HOME"] = str(self.home)
        return env

    def begin(self) -> None:
        with self.idle:
            self.running += 1

    def end(self) -> None:
        with self.idle:
            self.running -= 1
            self.idle.notify_all()

    def turn(self, thread: str, text: str, message_id: str | None) -> dict[str, Any]:
        if message_id and (done := self.store.answered(message_id)) is not None:
            return done
        lock = self.store.thread_lock(thread)
        if not lock.acquire(timeout=WAIT_TURN_S):
            raise Failure(409, f"a turn on {thread} is still running", "send it again later")
        try:
            if message_id and (done := self.store.answered(message_id)) is not None:
                return done
            row = self.store.session(thread)
            argv = [self.program, "chat", "-Q", "-q", text, "--no-restore-cwd"]
            if row.get("session"):
                argv += ["--resume", str(row["session"])]
            try:
                r = subprocess.run(
                    argv,
                    env=self.env(),
                    cwd=str(self.agent.get("workdir") or self.home),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=TURN_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired as e:
                raise Failure(502, f"Hermes did not answer within {TURN_TIMEOUT_S:g}s") from e
            sessions = SESSION_RE.findall(r.stderr)
            answer = r.stdout.strip()
            if r.returncode != 0 or not answer or not sessions:
                said = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
                said = [ln for ln in said if not SESSION_RE.match(ln.strip())]
                errors = [ln for ln in said if re.search(r"error|fail", ln, re.IGNORECASE)]
                last = (errors or said or ["no reason given"])[-1]
                raise Failure(502, f"Hermes's turn failed (exit {r.returncode}): {last[:300]}")
            number = int(row.get("count", 0)) + 2
            out = {"thread": thread, "text": answer, "message": number - 1, "number": number}
            self.store.record(thread, sessions[-1], message_id, out)
            return out
        finally:
            lock.release()


def make_handler(hermes: Hermes, key: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            length = (self.headers.get("Content-Length") or "0").strip()
            if not length.isdigit() or not length.isascii():
                raise Failure(400, "no plain Content-Length")
            n = int(length)
            if n > MAX_BODY:
                raise Failure(413, "the body is over 1 MiB")
            try:
                doc = json.loads(self.rfile.read(n) or b"{}")
            except ValueError as e:
                raise Failure(400, "the body is not JSON") from e
            if not isinstance(doc, dict):
                raise Failure(400, "the body is not a JSON object")
            return doc

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            want = "Bearer " + base64.b64encode(key).decode()
            return hmac.compare_digest(given.encode(), want.encode())

        def _serve(self, method: str) -> None:
            try:
                if method == "POST" and self.path == "/_link/proof":
                    body = self._body()
                    try:
                        challenge = base64.b64decode(str(body.get("challenge", "")), validate=True)
                    except (binascii.Error, ValueError) as e:
                        raise Failure(400, "the challenge is not base64") from e
                    if not 1 <= len(challenge) <= 1024:
                        raise Failure(400, "the challenge is not 1 to 1024 bytes")
                    mac = hmac.new(key, ENDPOINT_LABEL + challenge, hashlib.sha256).digest()
                    self._send(200, {"proof": base64.b64encode(mac).decode()})
                    return
                if not self._authorized():
                    raise Failure(401, "a missing or wrong key")
                if method == "GET" and self.path == "/_link/status":
                    a = hermes.agent
                    self._send(
                        200,
                        {
                            "id": a.get("id"),
                            "owner": a.get("owner"),
                            "name": a.get("name"),
                            "sandboxed": a.get("sandboxed"),
                            "pid": os.getpid(),
                            "harness": "hermes",
                        },
                    )
                elif method == "POST" and self.path == "/_link/message":
                    body = self._body()
                    thread, text = body.get("thread"), body.get("text")
                    mid = body.get("message_id")
                    if not isinstance(thread, str) or not isinstance(text, str) or not text:
                        raise Failure(400, "thread and text must be texts")
                    if mid is not None and not isinstance(mid, str):
                        raise Failure(400, "message_id must be a text")
                    hermes.begin()  # until its answer is written: a stop waits for it
                    try:
                        self._send(200, hermes.turn(thread, text, mid))
                    except Failure as f:
                        self._send(f.code, {"error": f.error, "hint": f.hint})
                    finally:
                        hermes.end()
                else:
                    raise Failure(404, f"no {method} {self.path} here")
            except Failure as f:
                self._send(f.code, {"error": f.error, "hint": f.hint})

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

    return Handler


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        conn, _ = super().get_request()
        return conn, ("unix", 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lnk_hermes.serve")
    p.add_argument("--home", required=True)
    p.add_argument("--hermes", required=True)
    p.add_argument("--key-file", required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--unix")
    where.add_argument("--port", type=int)
    a = p.parse_args(argv)
    key = Path(a.key_file).read_bytes()
    hermes = Hermes(a.hermes, Path(a.home))
    handler = make_handler(hermes, key)
    server: socketserver.BaseServer
    if a.unix:
        Path(a.unix).unlink(missing_ok=True)
        old = os.umask(0o177)
        try:
            server = UnixHTTPServer(a.unix, handler)
        finally:
            os.umask(old)
    else:
        server = ThreadingHTTPServer(("127.0.0.1", a.port), handler)

    def on_signal(signum: int, frame: object) -> None:
        threading.Thread(target=stop_now, args=(server,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"lnk-hermes: Hermes answers at {a.unix or a.port}", flush=True)
    server.serve_forever()
    server.server_close()  # no new connection; the turns under way end and answer
    hermes.wait_idle(STOP_WAIT_S)
    return 0


def stop_now(server: socketserver.BaseServer) -> None:
    """End ``serve_forever`` at once: it notices a stop only when its ``select`` wakes,
    at its next poll (half a second: every stop of the agent, a move's pause too, waited
    for it), so connect to its own socket until it has ended."""
    ending = threading.Thread(target=server.shutdown, daemon=True)
    ending.start()
    while ending.is_alive():
        if isinstance(server, socketserver.TCPServer):
            try:
                with socket.socket(server.address_family) as s:
                    s.settimeout(0.5)
                    s.connect(server.server_address)
            except OSError:
                pass
        ending.join(0.02)


if __name__ == "__main__":
    sys.exit(main())
