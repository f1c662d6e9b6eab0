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
``lnk agent status``.

Bounded: ``MAX_CONNECTIONS`` at once, a request head of ``MAX_HEAD`` bytes
read within ``HEAD_TIMEOUT_S``, one buffer per direction per connection.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from lnk.agents.grants import Spec, host_listed, norm_host, read_spec
from lnk.errors import LnkError, PortsUnavailable
from lnk.sandbox.relay import pump

SOCKET_NAME = "proxy.sock"
MODEL_PREFIX = "/.lnk/model"
MAX_CONNECTIONS = 128
MAX_HEAD = 64 * 1024
MAX_MODEL_BODY = 32 << 20
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
CHUNK = 256 * 1024
STD_PORTS = (80, 443)

AddrInfo = tuple[socket.AddressFamily, tuple[str, int] | tuple[str, int, int, int]]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# private, shared and special networks: never reached unless a grant names them
PRIVATE_NETS = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",  # CGNAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, cloud metadata
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/3",  # multicast and reserved
        "::/127",
        "fc00::/7",  # ULA
        "fe80::/10",
        "ff00::/8",
    )
]
NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_v4(ip: Address) -> Address:
    """The IPv4 address an IPv6 form carries (::ffff:a.b.c.d, 6to4, NAT64), else ``ip``."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def own_addresses() -> set[Address]:
    """This machine's own addresses (every interface's), from /proc."""
    out: set[Address] = set()
    with contextlib.suppress(OSError):
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
        for i, line in enumerate(lines):
            if "/32 host LOCAL" in line and i > 0:
                with contextlib.suppress(ValueError):
                    out.add(ipaddress.IPv4Address(lines[i - 1].split()[-1]))
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            with contextlib.suppress(ValueError):
                out.add(ipaddress.IPv6Address(":".join(raw[i : i + 4] for i in range(0, 32, 4))))
    return out


def classify(ip: Address, own: set[Address]) -> str:
    """``own`` (this machine), ``private`` (a network of its) or ``public``."""
    v4 = _embedded_v4(ip)
    if ip in own or v4 in own or v4.is_loopback or v4.is_unspecified:
        return "own"
    if any(v4.version == n.version and v4 in n for n in PRIVATE_NETS):
        return "private"
    return "public"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    why: str
    addrs: tuple[AddrInfo, ...] = ()  # the checked addresses to connect to, in order


class Policy:
    """Where the agent may go, from its grants (see module doc)."""

    def __init__(self, spec: Spec, own: set[Address] | None = None) -> None:
        self.spec = spec
        self.own = own if own is not None else own_addresses()
        self.tcp = set(spec.tcp_endpoints())
        self.ports = set(spec.ports)
        self.lan_names = {h for h in spec.lan if "/" not in h and not _is_ip(h)}
        self.lan_nets = [
            ipaddress.ip_network(h, strict=False) for h in spec.lan if "/" in h or _is_ip(h)
        ]

    def _lan_covers(self, host: str, ip: Address) -> bool:
        v4 = _embedded_v4(ip)
        return host in self.lan_names or any(
            a.version == n.version and a in n for n in self.lan_nets for a in {ip, v4}
        )

    def decide(self, host: str, port: int) -> Decision:
        h = norm_host(host)
        if not h or not 0 < port < 65536:
            return Decision(False, "not a host and port")
        if self.spec.mode == "host":
            addrs = _resolve(h, port)
            return Decision(True, "network mode host", tuple(addrs)) if addrs else _unresolved(h)
        listed = host_listed(self.spec.hosts, h)
        if listed is False:
            return Decision(False, f"{h} is denied by the agent's [internet] hosts")
        named_tcp = (h, port) in self.tcp
        literal = _is_ip(h)
        if (
            listed is None
            and not named_tcp
            and h not in self.lan_names
            and not literal
            and h != "localhost"
        ):
            return Decision(False, f"{h} is not on the agent's [internet] hosts (--host {h})")
        std = port in STD_PORTS or named_tcp
        addrs = _resolve(h, port)
        if not addrs:
            return _unresolved(h)
        why = ""
        ok: list[AddrInfo] = []
        for fam, sa in addrs:
            ip = ipaddress.ip_address(sa[0].split("%")[0])
            kind = classify(ip, self.own)
            if kind == "own":
                if port in self.ports or (std and self._lan_covers(h, ip)):
                    ok.append((fam, sa))
                    continue
                why = why or (
                    f"{h} is this machine ({ip}); its port {port} is not granted (--port {port})"
                )
            elif kind == "private":
                if std and self._lan_covers(h, ip):
                    ok.append((fam, sa))
                    continue
                why = why or f"{h} is on a private network ({ip}), not granted (--lan-host {h})"
            elif not std:
                why = why or (
                    f"port {port} of {h} is not granted: names reach 80 and 443 (--tcp {h}:{port})"
                )
            elif listed or named_tcp:
                ok.append((fam, sa))
            else:
                why = why or f"{h} is not on the agent's [internet] hosts (--host {h})"
        if ok:
            return Decision(True, "allowed", tuple(ok))
        return Decision(False, why)


def _unresolved(h: str) -> Decision:
    return Decision(False, f"{h} does not resolve")


def _is_ip(h: str) -> bool:
    try:
        ipaddress.ip_address(h)
        return True
    except ValueError:
        return False


def _resolve(host: str, port: int) -> list[AddrInfo]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [(fam, sa) for fam, _, _, _, sa in infos if fam in (socket.AF_INET, socket.AF_INET6)]  # type: ignore[misc]


def _pump(src: socket.socket, dst: socket.socket, counter: list[int], idx: int) -> None:
    # TLS has no half-close: an SSL socket is never shut for writing
    pump(src, dst, counter, idx, half_close=not isinstance(dst, ssl.SSLSocket))


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """The request head (through the blank line) and what came after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(8192)
        if not chunk:
            raise ConnectionError("the client closed before a full request head")
        data += chunk
        if len(data) > MAX_HEAD:
            raise ValueError("request head too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _answer(conn: socket.socket, code: int, reason: str, why: str) -> None:
    body = (why + "\n").encode()
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        f"X-Lnk-Proxy: {why[:200]}\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        conn.sendall(head.encode("latin-1", "replace") + body)


def _size(n: int) -> str:
    return (
        f"{n} B"
        if n < 1024
        else f"{n / 1024:.1f} KiB"
        if n < 1 << 20
        else f"{n / (1 << 20):.1f} MiB"
    )


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
    ) -> None:
        self.socket_path = socket_path
        self.grants = grants
        self.runtime = runtime
        self.model_url = model_url.rstrip("/")
        self.model_key = model_key
        self._log = log or _print_log
        self._slots = threading.BoundedSemaphore(max_connections)
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._policy_lock = threading.Lock()
        self._policy: Policy | None = None
        self._policy_stamp: tuple[int, int] | None = None
        self._own_at = 0.0
        self.last_refusal: dict[str, object] | None = None

    # -- policy -------------------------------------------------------------
    def policy(self) -> Policy:
        """The agent's grants as they are now (re-read when the file changed)."""
        try:
            st = self.grants.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        with self._policy_lock:
            fresh_own = time.monotonic() - self._own_at > 10.0
            if self._policy is None or stamp != self._policy_stamp or fresh_own:
                own = own_addresses() if fresh_own or self._policy is None else self._policy.own
                if fresh_own:
                    self._own_at = time.monotonic()
                try:
                    spec = read_spec(self.grants)
                except LnkError as e:
                    self._log(
                        f"lnk proxy: the agent's grants can't be read ({e.message}); no way out"
                    )
                    spec = Spec(hosts=[])
                self._policy = Policy(spec, own)
                self._policy_stamp = stamp
            return self._policy

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
        self._thread = threading.Thread(target=self._accept_loop, name="proxy accept", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.socket_path.unlink(missing_ok=True)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                _answer(client, 503, "Busy", "the agent's proxy has too many connections")
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            client.settimeout(HEAD_TIMEOUT_S)
            try:
                head, rest = _read_head(client)
                line, *header_lines = head.decode("latin-1").split("\r\n")
                method, target, _version = line.split(" ", 2)
            except (OSError, ValueError) as e:
                _answer(client, 400, "Bad Request", f"not a proxy request: {e}")
                return
            client.settimeout(None)
            if method == "CONNECT":
                host, _, port_s = target.rpartition(":")
                port = int(port_s) if port_s.isdigit() else 0
                self._tunnel(client, method, host, port, rest, head=None)
            elif target.startswith(MODEL_PREFIX + "/") or target == MODEL_PREFIX:
                self._model(client, method, target[len(MODEL_PREFIX) :], header_lines, rest)
            elif target.lower().startswith("http://"):
                u = urlsplit(target)
                try:
                    port = u.port or 80
                except ValueError:
                    _answer(client, 400, "Bad Request", "not a port")
                    return
                path = (u.path or "/") + (f"?{u.query}" if u.query else "")
                kept = [
                    h
                    for h in header_lines
                    if h.split(":", 1)[0].strip().lower()
                    not in ("proxy-connection", "proxy-authorization", "connection", "keep-alive")
                ]
                out = "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close"])
                self._tunnel(
                    client, method, u.hostname or "", port, rest, head=out.encode("latin-1")
                )
            else:
                _answer(client, 400, "Bad Request", "this is the agent's proxy: use it as a proxy")
        finally:
            with contextlib.suppress(OSError):
                client.close()
            self._slots.release()

    def _refuse(self, client: socket.socket, what: str, why: str, host: str, port: int) -> None:
        self._log(f"lnk proxy: refused {what}: {why}")
        self.last_refusal = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": norm_host(host),
            "port": port,
            "why": why,
        }
        if self.runtime is not None:
            with contextlib.suppress(OSError):
                tmp = self.runtime / ".proxy-refused.json.tmp"
                tmp.write_text(json.dumps(self.last_refusal) + "\n")
                os.replace(tmp, self.runtime / "proxy-refused.json")
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
            f"lnk proxy: allowed {what}: sent {_size(counter[0])}, received {_size(counter[1])}"
        )

    def _model(
        self, client: socket.socket, method: str, path: str, header_lines: list[str], rest: bytes
    ) -> None:
        """The agent's model: the request as sent, to the real base URL, with the real key."""
        if not self.model_url:
            _answer(client, 404, "Not Found", "the agent has no hosted model to reach")
            return
        base = urlsplit(self.model_url)
        host, tls = base.hostname or "", base.scheme == "https"
        port = base.port or (443 if tls else 80)
        path = path or "/"
        if not path.startswith((base.path.rstrip("/") or "") + "/") and base.path not in ("", "/"):
            _answer(client, 403, "Forbidden", "only the model's own API is reached this way")
            return
        headers: list[str] = []
        length = 0
        for h in header_lines:
            name, _, value = h.partition(":")
            low = name.strip().lower()
            if low == "content-length":
                length = int(value.strip()) if value.strip().isdigit() else -1
            if low in ("host", "authorization", "connection", "proxy-connection", "keep-alive"):
                continue
            if low == "transfer-encoding":
                _answer(client, 411, "Length Required", "send the model request with a length")
                return
            headers.append(h)
        if not 0 <= length <= MAX_MODEL_BODY:
            _answer(client, 413, "Too Large", "the model request is too large")
            return
        body = rest
        client.settimeout(HEAD_TIMEOUT_S)
        try:
            while len(body) < length:
                chunk = client.recv(min(CHUNK, length - len(body)))
                if not chunk:
                    return
                body += chunk
        except OSError:
            return
        client.settimeout(None)
        what = f"model {method} {host}:{port}{path}"
        up = self._dial(client, what, host, port)
        if up is None:
            return
        key = self.model_key() if self.model_key else None
        if key:
            headers.append(f"Authorization: Bearer {key}")
        host_header = host if port == (443 if tls else 80) else f"{host}:{port}"
        out = "\r\n".join(
            [f"{method} {path} HTTP/1.1", f"Host: {host_header}", *headers, "Connection: close"]
        )
        counter = [0, 0]
        try:
            if tls:
                ctx = ssl.create_default_context()
                up = ctx.wrap_socket(up, server_hostname=host)
            up.sendall(out.encode("latin-1") + b"\r\n\r\n" + body[:length])
            counter[0] = len(out) + 4 + length
            _pump(up, client, counter, 1)
        except (OSError, ssl.SSLError) as e:
            self._log(f"lnk proxy: {what} failed: {e}")
            if counter[1] == 0:
                _answer(client, 502, "Bad Gateway", f"the model at {host} failed: {e}")
        finally:
            up.close()
        self._log(
            f"lnk proxy: allowed {what}{' (key added)' if key else ''}: "
            f"sent {_size(counter[0])}, received {_size(counter[1])}"
        )


_log_lock = threading.Lock()


def _print_log(msg: str) -> None:
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
    with _log_lock:
        sys.stdout.write(f"{stamp} {msg}\n")
        sys.stdout.flush()


def last_refusal(runtime: Path) -> dict[str, object] | None:
    """The last connection the agent's proxy refused, if any."""
    try:
        data = json.loads((runtime / "proxy-refused.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main(argv: list[str] | None = None) -> int:
    """``python -m lnk.runtime.proxy SOCKET GRANTS [RUNTIME]``: a proxy alone, until SIGTERM."""
    import signal

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m lnk.runtime.proxy SOCKET GRANTS [RUNTIME]", file=sys.stderr)
        return 2
    proxy = AgentProxy(Path(args[0]), Path(args[1]), runtime=Path(args[2]) if args[2:] else None)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    proxy.start()
    _print_log(f"lnk proxy: listening on {args[0]}")
    done.wait()
    proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
