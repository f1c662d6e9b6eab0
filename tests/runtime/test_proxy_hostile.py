"""The agent's proxy against what a model-written tool call could send it (issue 22).

The model server here logs every request it can find in the bytes it gets,
read as leniently as a careless server would (a bare LF ends a line, one
connection may carry several requests), so a request smuggled past the proxy
shows up in its log with whatever key the proxy added.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lnk.agents import grants, registry
from lnk.agents.layout import Machine
from lnk.runtime.egress import Policy, host_form
from lnk.runtime.proxy import AgentProxy
from tests.runtime.conftest import ProxyProcess, Public, connect_through

REAL_KEY = "sk-real-hostile-0123456789"


@dataclass
class LoggingModel:
    port: int
    requests: list[dict[str, Any]] = field(default_factory=list)

    def keyed(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if REAL_KEY in r["head"]]


def _lenient_requests(data: bytes) -> list[dict[str, Any]]:
    """Every request line a lenient server would find, with the head lines after it."""
    out: list[dict[str, Any]] = []
    lines = data.replace(b"\r", b"").split(b"\n")
    for i, line in enumerate(lines):
        parts = line.split(b" ")
        if len(parts) == 3 and parts[2].startswith(b"HTTP/1."):
            head = []
            for h in lines[i + 1 :]:
                if not h:
                    break
                head.append(h.decode("latin-1"))
            out.append(
                {
                    "line": line.decode("latin-1"),
                    "method": parts[0].decode(),
                    "head": "\n".join(head),
                }
            )
    return out


@pytest.fixture
def model() -> Iterator[LoggingModel]:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    m = LoggingModel(ls.getsockname()[1])
    stop = threading.Event()

    def one(c: socket.socket) -> None:
        c.settimeout(1.0)
        data = b""
        try:
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = 0
                    for h in head.split(b"\r\n")[1:]:
                        if h.lower().startswith(b"content-length:"):
                            length = int(h.split(b":", 1)[1])
                    if len(body) >= length:
                        break
        except OSError:
            pass
        found = _lenient_requests(data)
        m.requests += found
        echo = data if found and found[0]["method"] == "TRACE" else b'{"ok": true}'
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(echo))
        c.sendall(echo)
        c.close()

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield m
    stop.set()
    ls.close()


@pytest.fixture
def proxy(model: LoggingModel, home: Path) -> Iterator[AgentProxy]:
    a = registry.create(Machine.current(), "main")
    spec = grants.read_spec(a.folders.sandbox_toml)
    spec.ports = [model.port]
    grants.write_spec(a.folders.sandbox_toml, spec)
    net = home / "net"
    net.mkdir(mode=0o700)
    px = AgentProxy(
        net / "proxy.sock",
        a.folders.sandbox_toml,
        model_url=f"http://127.0.0.1:{model.port}/v1",
        model_key=lambda: REAL_KEY,
        log=lambda line: None,
        head_timeout=1.0,
    )
    px.start()
    yield px
    px.stop()


def ask(px: AgentProxy, raw: bytes, wait: float = 10.0) -> bytes:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(wait)
    s.connect(str(px.socket_path))
    s.sendall(raw)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except OSError:
        pass
    s.close()
    return data


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


BODY = b'{"model": "m", "messages": []}'


def post(path: str = "/.lnk/model/v1/chat/completions", extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(BODY)
        + BODY
    )


def test_a_plain_model_request_gets_the_key_and_only_allowed_headers(
    proxy: AgentProxy, model: LoggingModel
) -> None:
    extra = b"X-Forwarded-Host: evil.example\r\nAuthorization: Bearer placeholder\r\n"
    assert status(ask(proxy, post(extra=extra))) == 200
    [r] = model.requests
    assert r["line"] == "POST /v1/chat/completions HTTP/1.1"
    head = r["head"].lower()
    assert f"authorization: bearer {REAL_KEY}".lower() in head
    assert "placeholder" not in head and "evil.example" not in head
    assert f"host: 127.0.0.1:{model.port}" in head


@pytest.mark.parametrize("method", ["TRACE", "PUT", "DELETE", "OPTIONS", "CONNECT2", "PATCH"])
def test_only_post_and_get_reach_the_model(
    proxy: AgentProxy, model: LoggingModel, method: str
) -> None:
    answer = ask(proxy, f"{method} /.lnk/model/v1/x HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status(answer) == 405
    assert REAL_KEY.encode() not in answer
    assert model.requests == []


@pytest.mark.parametrize(
    "raw",
    [
        # a bare LF in a header: a lenient server reads a second request behind it
        post(extra=b"X-A: 1\nGET /admin HTTP/1.1\nHost: evil\n"),
        post(extra=b"X-A: 1\rGET /admin HTTP/1.1\r"),
        # a folded header line
        post(extra=b"X-A: 1\r\n GET /admin HTTP/1.1\r\n"),
        # both a Transfer-Encoding and a Content-Length
        post(extra=b"Transfer-Encoding: chunked\r\n"),
        # two lengths
        post(extra=b"Content-Length: 0\r\n"),
        # a control character in a value
        post(extra=b"X-A: \x1b[2J\r\n"),
        # a header name that is not a token
        post(extra=b"X A: 1\r\n"),
        # a request line smuggled inside the target
        b"GET /.lnk/model/v1/x HTTP/1.1 GET /y HTTP/1.1\r\n\r\n",
    ],
)
def test_a_smuggled_request_never_reaches_the_model(
    proxy: AgentProxy, model: LoggingModel, raw: bytes
) -> None:
    answer = ask(proxy, raw)
    assert status(answer) == 400, answer
    time.sleep(0.2)
    assert model.keyed() == [] and model.requests == []


@pytest.mark.parametrize(
    "path",
    [
        "/.lnk/model/v1/../admin",
        "/.lnk/model/v1/%2e%2e/admin",
        "/.lnk/model/v1/%2E%2e/admin",
        "/.lnk/model/v1/x%2fy",
        "/.lnk/model/v1//x",
        "/.lnk/model/v1/./x",
        "/.lnk/model/v1\\..\\admin",
        "/.lnk/model/admin",
        "/.lnk/model/v1x/chat",
    ],
)
def test_the_model_path_is_normalised_before_its_prefix_is_checked(
    proxy: AgentProxy, model: LoggingModel, path: str
) -> None:
    answer = ask(proxy, post(path))
    assert status(answer) in (400, 403), answer
    assert model.requests == []


@pytest.mark.parametrize(
    "raw",
    ["CONNECT 127.0.0.1:\u00b2 HTTP/1.1\r\n\r\n", "GET http://[::1/ HTTP/1.1\r\n\r\n"],
)
def test_inputs_that_killed_a_thread_get_a_400_and_the_proxy_serves_on(
    proxy: AgentProxy, model: LoggingModel, raw: str
) -> None:
    assert status(ask(proxy, raw.encode("utf-8"))) == 400
    assert status(ask(proxy, post())) == 200  # still serving


def test_a_slowloris_client_is_cut_at_its_deadline(proxy: AgentProxy) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(proxy.socket_path))
    s.settimeout(10)
    cut = False
    for ch in b"GET http://example.com/ HTTP/1.1\r\nX-Slow: " + b"a" * 40:
        try:
            s.sendall(bytes([ch]))
            time.sleep(0.1)  # a byte every 100 ms: each read is quick, the head never ends
        except OSError:
            cut = True
            break
    if not cut:
        s.settimeout(5)
        try:
            cut = s.recv(1) == b""
        except OSError:
            cut = True
    s.close()
    # the head deadline is 1 s here; 40 bytes at 100 ms each would take 4 s and more
    assert cut


def test_non_ascii_and_idna_spellings_of_a_denied_name_are_refused() -> None:
    p = Policy(grants.Spec(hosts=["*", "!vm"]), set())
    for spelling in ("v\u00adm", "\uff56\uff4d", "V\u00adM.", "vm\u200b", "v\u0301m"):
        d = p.decide(spelling, 443)
        assert not d.allowed and "ASCII" in d.why, spelling
    assert "denied" in p.decide("VM.", 443).why
    assert host_form("xn--bcher-kva.example") == "xn--bcher-kva.example"
    assert host_form("b\u00fccher.example") is None


def test_a_soft_hyphen_in_connect_is_refused_by_the_real_proxy(proxy: AgentProxy) -> None:
    grants_file = proxy.grants
    spec = grants.read_spec(grants_file)
    spec.hosts = ["*", "!vm"]
    grants.write_spec(grants_file, spec)
    for raw in (b"CONNECT v\xadm:443 HTTP/1.1\r\n\r\n", b"CONNECT v\xc2\xadm:443 HTTP/1.1\r\n\r\n"):
        assert status(ask(proxy, raw)) == 400


def test_a_denied_name_s_address_is_denied_by_any_name(
    proxy_process: Any, public: Public, tmp_path: Path
) -> None:
    g = tmp_path / "sandbox.toml"
    p0 = public.ports[0]
    g.write_text(
        f'[internet]\nhosts = ["*", "!vm"]\n[tcp]\nendpoints = ["alias:{p0}", "{public.address}:{p0}"]\n'
    )
    px: ProxyProcess = proxy_process(g, hosts={"vm": public.address, "alias": public.address})
    sock = px.net / "proxy.sock"
    for target in (f"alias:{p0}", f"{public.address}:{p0}"):
        answer = connect_through(sock, target, b"hi")
        assert answer.startswith(b"HTTP/1.1 403"), answer
        assert b"an address of a host" in answer
    assert connect_through(sock, f"vm:{p0}", b"hi").startswith(b"HTTP/1.1 403")


OWN = {ipaddress.ip_address("192.0.2.7")}


@pytest.mark.parametrize(
    "host",
    [
        "::a01:203",  # IPv4-compatible form of 10.1.2.3
        "::b00:1",  # IPv4-compatible form of a public address: deprecated, special
        "64:ff9b:1::1",  # local-use translation
        "fec0::1",  # site-local
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "2001:2::1",  # benchmarking
        "2001:db8::1",  # documentation
        "3fff::1",  # documentation
        "5f00::1",  # SRv6
        "100::1",  # discard
        "192.0.2.1",
        "198.51.100.1",
        "203.0.113.1",
        "240.0.0.1",
        "255.255.255.255",
        "192.88.99.1",
        "2002:c000:201::1",  # 6to4 of a documentation address
    ],
)
def test_every_special_range_is_refused_unless_granted(host: str) -> None:
    d = Policy(grants.Spec(hosts=["*"]), OWN).decide(host, 443)
    assert not d.allowed and ("private" in d.why or "this machine" in d.why), (host, d.why)


def test_a_lan_grant_does_not_open_this_machine() -> None:
    p = Policy(grants.Spec(hosts=["*"], lan=["192.0.2.0/24"]), OWN)
    assert p.decide("192.0.2.9", 443).allowed  # the LAN, as granted
    d = p.decide("192.0.2.7", 443)  # this machine, in that LAN
    assert not d.allowed and "this machine" in d.why
    assert (
        Policy(grants.Spec(hosts=["*"], lan=["192.0.2.0/24"], ports=[443]), OWN)
        .decide("192.0.2.7", 443)
        .allowed
    )


def _hand(px: AgentProxy, fds: list[int], data: bytes = b"LNK-LISTEN 1\n") -> bytes:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(px.socket_path))
    socket.send_fds(s, [data], fds)
    try:
        return s.recv(4096)
    finally:
        s.close()


def test_the_proxy_takes_only_a_loopback_tcp_listener_from_the_sandbox(
    proxy: AgentProxy, tmp_path: Path
) -> None:
    f = open(tmp_path / "file", "wb")  # noqa: SIM115 (closed below)
    wide = socket.socket()
    wide.bind(("0.0.0.0", 0))
    wide.listen()
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(tmp_path / "u.sock"))
    unix.listen()
    idle = socket.socket()
    idle.bind(("127.0.0.1", 0))  # bound, not listening
    good = socket.socket()
    good.bind(("127.0.0.1", 0))
    good.listen()
    try:
        for fds in ([f.fileno()], [wide.fileno()], [unix.fileno()], [idle.fileno()]):
            assert status(_hand(proxy, fds)) == 400
        assert status(_hand(proxy, [good.fileno()], b"LNK-LISTEN 2\n")) == 400
        assert proxy._adopted == []
        # the real thing is taken, and the proxy accepts on it: a request through it is served
        assert _hand(proxy, [good.fileno()]) == b"OK\n"
        c = socket.create_connection(good.getsockname(), timeout=10)
        c.sendall(post())
        data = b""
        while chunk := c.recv(65536):
            data += chunk
        c.close()
        assert status(data) == 200
        for _ in range(8):  # at most a few listeners, whatever the sandbox sends
            _hand(proxy, [good.fileno()])
        assert len(proxy._adopted) == 4
    finally:
        for sk in (wide, unix, idle, good):
            sk.close()
        f.close()
