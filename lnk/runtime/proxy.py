"""The agent's proxy: its only way out of a sandbox with a network of its own.

One per agent, started by the runner outside the sandbox, listening on
``~/.lnk/agents/.net/<id>/proxy.sock``; a relay inside the sandbox carries
``127.0.0.1:<port>`` there (:mod:`lnk.sandbox.inrelay`).  It takes

* ``CONNECT host:port`` (HTTPS, and a raw protocol to a ``--tcp`` endpoint);
* plain HTTP in absolute form (``GET http://host/path``);
* ``/.lnk/model/...`` in origin form: the agent's model, forwarded over TLS to
  the ``[model] base_url`` with the real key added, so the harness holds only
  a placeholder.

Every destination goes through :class:`Policy`: the agent's
``Config/sandbox.toml`` (re-read when it changes, so ``lnk agent allow`` holds
at the next connection), denials before allows, ports 80 and 443 for names and
other ports only as named; the proxy resolves a name itself and refuses this
machine's addresses and private networks unless a grant names them, then
connects to the address it checked.  Each connection is one line in the
agent's log; the last refusal is kept in ``<runtime>/proxy-refused.json`` for
``lnk agent status`` (both ``proxy_log.py``).

Bounded: ``MAX_CONNECTIONS`` at once, a request head of ``MAX_HEAD`` bytes
read within ``HEAD_TIMEOUT_S``, one buffer per direction per connection.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from lnk.agents.grants import norm_host
from lnk.errors import PortsUnavailable
from lnk.runtime import model_route
from lnk.runtime.egress import LivePolicy, Policy
from lnk.runtime.httphead import BadRequest, Head, parse_head, read_head
from lnk.runtime.proxy_log import keep_refusal, print_log, refusal, size_text
from lnk.sandbox.relay import pump
from lnk.signals import on_signals

SOCKET_NAME = "proxy.sock"
MODEL_PREFIX = model_route.PREFIX
MAX_CONNECTIONS = 128
HEAD_TIMEOUT_S = 30.0  # the whole head, from the accept (not per read)
BODY_TIMEOUT_S = 120.0  # a model request's body, from the accept
CONNECT_TIMEOUT_S = 10.0
CHUNK = 256 * 1024
_CONNECT_TARGET = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\[\]:]+):([0-9]{1,5})$")
LISTEN_HANDOFF = b"LNK-LISTEN 1\n"  # the sandbox's relay handing its listener over (inrelay)
MAX_ADOPTED = 4
_HOP = ("proxy-connection", "proxy-authorization", "connection", "keep-alive", "te", "upgrade")


def _pump(src: socket.socket, dst: socket.socket, counter: list[int], idx: int) -> None:
    # TLS has no half-close: an SSL socket is never shut for writing
    pump(src, dst, counter, idx, half_close=not isinstance(dst, ssl.SSLSocket))


def _answer(conn: socket.socket, code: int, reason: str, why: str) -> None:
    body = (why + "\n").encode("utf-8", "replace")
    one_line = why.encode("ascii", "backslashreplace").decode("ascii")
    one_line = "".join(c if " " <= c <= "~" else "?" for c in one_line)[:200]
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        f"X-Lnk-Proxy: {one_line}\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        conn.sendall(head.encode("ascii") + body)


class AgentProxy:
    """The proxy for one agent (see module doc).

    ``grants`` is the agent's sandbox file, re-read when it changes;
    ``model_url`` the real ``[model] base_url`` (or "") and ``model_key`` a
    callable giving the key to add (or None).
    """

    def __init__(
        self,
        socket_path: Path,
        grants: Path,
        *,
        runtime: Path | None = None,
        model_url: str = "",
        model_key: Callable[[], str | None] | None = None,
        log: Callable[[str], None] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT_S,
    ) -> None:
        self.socket_path = socket_path
        self.grants = grants
        self.runtime = runtime
        self.model_url = model_url.rstrip("/")
        self.model_key = model_key
        self._log = log or print_log
        self._slots = threading.BoundedSemaphore(max_connections)
        self.head_timeout = head_timeout
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._adopted: list[socket.socket] = []
        self._stopping = threading.Event()
        self._policy = LivePolicy(grants, self._log)
        self.last_refusal: dict[str, object] | None = None

    # -- policy -------------------------------------------------------------
    def policy(self) -> Policy:
        """The agent's grants as they are now (re-read when the file changed)."""
        return self._policy.now()

    # -- serving ------------------------------------------------------------
    def start(self) -> None:
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket_path.unlink(missing_ok=True)
        folder, name = os.path.split(str(self.socket_path))
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            ls.bind(f"/proc/self/fd/{fd}/{name}")
        except OSError as e:
            ls.close()
            raise PortsUnavailable(
                f"the agent's proxy can't listen at {self.socket_path}: {e}"
            ) from e
        finally:
            os.close(fd)
        ls.listen(128)
        self._listener = ls
        self.policy()
        self._thread = threading.Thread(
            target=self._accept_loop, args=(ls,), name="proxy accept", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for ls in [self._listener, *self._adopted]:
            if ls is not None:
                with contextlib.suppress(OSError):
                    ls.shutdown(socket.SHUT_RDWR)
                ls.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.socket_path.unlink(missing_ok=True)

    def _adopt(self, client: socket.socket, fds: list[int], data: bytes) -> None:
        """The sandbox's relay hands over its TCP listener (one hop and two copies fewer for
        every byte); taken only as what it must be: a listening TCP socket on 127.0.0.1."""
        socks = [socket.socket(fileno=fd) for fd in fds]
        ok = False
        if data == LISTEN_HANDOFF and len(socks) == 1 and len(self._adopted) < MAX_ADOPTED:
            ls = socks[0]
            with contextlib.suppress(OSError):
                ok = (
                    ls.family == socket.AF_INET
                    and ls.type == socket.SOCK_STREAM
                    and ls.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
                    and ls.getsockname()[0] == "127.0.0.1"
                )
        if not ok:
            for sk in socks:
                sk.close()
            _answer(client, 400, "Bad Request", "not a listener the proxy takes")
            return
        self._adopted.append(socks[0])
        threading.Thread(
            target=self._accept_loop, args=(socks[0],), name="proxy accept", daemon=True
        ).start()
        with contextlib.suppress(OSError):
            client.sendall(b"OK\n")

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                _answer(client, 503, "Busy", "the agent's proxy has too many connections")
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        accepted = time.monotonic()
        try:
            self._handle(client, accepted)
        except Exception as e:  # a bad input ends its connection, never the proxy's thread
            self._log(f"lnk proxy: a connection failed: {type(e).__name__}: {e}")
            _answer(client, 400, "Bad Request", "the agent's proxy could not take this request")
        finally:
            with contextlib.suppress(OSError):
                client.close()
            self._slots.release()

    def _handle(self, client: socket.socket, accepted: float) -> None:
        first = b""
        if client.family == socket.AF_UNIX:
            # a unix connection may hand a listener over (its first bytes, with the socket)
            client.settimeout(self.head_timeout)
            try:
                first, fds, _, _ = socket.recv_fds(client, 8192, 1)
            except OSError:
                return
            if fds:
                self._adopt(client, fds, first)
                return
            if not first:
                return
        try:
            raw, rest = read_head(client, accepted + self.head_timeout, first)
            head = parse_head(raw)
        except BadRequest as e:
            _answer(client, 400, "Bad Request", f"not a proxy request: {e}")
            return
        except (OSError, ConnectionError):
            return  # gone, or out of time: nothing to answer
        if head.method == "CONNECT":
            m = _CONNECT_TARGET.match(head.target)
            if m is None or not 0 < int(m.group(2)) < 65536:
                _answer(client, 400, "Bad Request", "CONNECT takes host:port")
                return
            client.settimeout(None)
            self._tunnel(client, "CONNECT", m.group(1), int(m.group(2)), rest, head=None)
        elif head.target == MODEL_PREFIX or head.target.startswith(
            (f"{MODEL_PREFIX}/", f"{MODEL_PREFIX}?")
        ):
            self._model(client, head, rest, accepted + BODY_TIMEOUT_S)
        elif head.target.lower().startswith("http://"):
            self._forward(client, head, rest)
        else:
            _answer(client, 400, "Bad Request", "this is the agent's proxy: use it as a proxy")

    def _forward(self, client: socket.socket, head: Head, rest: bytes) -> None:
        """Plain HTTP in absolute form, sent on in origin form (no key is ever added)."""
        try:
            u = urlsplit(head.target)
            port = u.port or 80
        except ValueError:
            _answer(client, 400, "Bad Request", "not a URL with a host and port")
            return
        if not u.hostname:
            _answer(client, 400, "Bad Request", "not a URL with a host")
            return
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        kept = [f"{n}: {v}" for n, v in head.headers if n.lower() not in _HOP]
        out = "\r\n".join([f"{head.method} {path} HTTP/1.1", *kept, "Connection: close"])
        client.settimeout(None)
        self._tunnel(client, head.method, u.hostname, port, rest, head=out.encode("ascii"))

    def _refuse(self, client: socket.socket, what: str, why: str, host: str, port: int) -> None:
        self._log(f"lnk proxy: refused {what}: {why}")
        self.last_refusal = refusal(host, port, why)
        if self.runtime is not None:
            keep_refusal(self.runtime, self.last_refusal)
        _answer(client, 403, "Forbidden", f"refused by the agent's proxy: {why}")

    def _dial(self, client: socket.socket, what: str, host: str, port: int) -> socket.socket | None:
        d = self.policy().decide(host, port)
        if not d.allowed or not d.addrs:
            self._refuse(client, what, d.why, host, port)
            return None
        err: OSError | None = None
        for fam, sa in d.addrs:
            up = socket.socket(fam, socket.SOCK_STREAM)
            up.settimeout(CONNECT_TIMEOUT_S)
            try:
                up.connect(sa)
                break
            except OSError as e:
                up.close()
                err = e
        else:
            self._log(f"lnk proxy: {what} failed: {err}")
            _answer(client, 502, "Bad Gateway", f"{host}:{port} could not be reached: {err}")
            return None
        up.settimeout(None)
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return up

    def _tunnel(
        self,
        client: socket.socket,
        method: str,
        host: str,
        port: int,
        rest: bytes,
        head: bytes | None,
    ) -> None:
        what = f"{method} {norm_host(host)}:{port}"
        up = self._dial(client, what, host, port)
        if up is None:
            return
        counter = [0, 0]  # up, down
        try:
            if head is None:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up.sendall(head + b"\r\n\r\n")
                counter[0] += len(head) + 4
            if rest:
                up.sendall(rest)
                counter[0] += len(rest)
            back = threading.Thread(target=_pump, args=(up, client, counter, 1), daemon=True)
            back.start()
            _pump(client, up, counter, 0)
            back.join()
        except OSError:
            pass
        finally:
            up.close()
        self._log(
            f"lnk proxy: allowed {what}: sent {size_text(counter[0])}, received {size_text(counter[1])}"
        )

    def _model(self, client: socket.socket, head: Head, rest: bytes, deadline: float) -> None:
        """The agent's model: a request rebuilt from what was checked, with the real key
        (:mod:`lnk.runtime.model_route`)."""
        if not self.model_url:
            _answer(client, 404, "Not Found", "the agent has no hosted model to reach")
            return
        up = model_route.Upstream.of(self.model_url)
        try:
            path, length = model_route.check(head, up)
        except model_route.Refusal as e:
            _answer(client, e.code, e.reason, str(e))
            return
        body = model_route.read_body(client, rest, length, deadline)
        if body is None:
            return
        client.settimeout(None)
        what = f"model {head.method} {up.host}:{up.port}{path}"
        conn = self._dial(client, what, up.host, up.port)
        if conn is None:
            return
        key = self.model_key() if self.model_key else None
        out = model_route.outgoing_head(head, path, up, key, length)
        counter = [0, 0]
        try:
            if up.tls:
                conn = ssl.create_default_context().wrap_socket(conn, server_hostname=up.host)
            conn.sendall(out + body)
            counter[0] = len(out) + length
            _pump(conn, client, counter, 1)
        except (OSError, ssl.SSLError) as e:
            self._log(f"lnk proxy: {what} failed: {e}")
            if counter[1] == 0:
                _answer(client, 502, "Bad Gateway", f"the model at {up.host} failed: {e}")
        finally:
            conn.close()
        self._log(
            f"lnk proxy: allowed {what}{' (key added)' if key else ''}: "
            f"sent {size_text(counter[0])}, received {size_text(counter[1])}"
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m lnk.runtime.proxy SOCKET GRANTS [RUNTIME]``: a proxy alone, until SIGTERM."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m lnk.runtime.proxy SOCKET GRANTS [RUNTIME]", file=sys.stderr)
        return 2
    proxy = AgentProxy(Path(args[0]), Path(args[1]), runtime=Path(args[2]) if args[2:] else None)
    done = threading.Event()
    on_signals(lambda _signum: done.set())  # the Event set outside a handler (lnk.signals)
    proxy.start()
    print_log(f"lnk proxy: listening on {args[0]}")
    done.wait()
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
