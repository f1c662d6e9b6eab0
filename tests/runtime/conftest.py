"""Real servers for the agent's proxy: a provider with its own test CA, and a "public" host.

* ``provider``: an OpenAI-compatible chat completions server over HTTPS on
  loopback, its certificate (for ``localhost``) signed by a CA made here.
* ``public``: a network namespace joined to this one by a veth pair, with an
  address outside every private range (11.0.0.0/24, a public range, routed nowhere but the test), running a
  TCP server on two ports that answers ``port <n>: <what it read>``.  The
  proxy treats it as the internet.
* ``hosts_file``: names for the proxy's own resolver, which a test gives a
  proxy by running it in a mount namespace of its own with the file over
  /etc/hosts (see ``proxy_process``).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.agent_runner import Running, start_agent

__all__ = ["Running", "start_agent"]


@dataclass
class CA:
    ca_pem: Path
    cert_pem: Path
    key_pem: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@pytest.fixture
def test_ca(tmp_path: Path) -> CA:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("lnk test CA"))
        .issuer_name(_name("lnk test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    d = tmp_path / "ca"
    d.mkdir()
    out = CA(d / "ca.pem", d / "cert.pem", d / "key.pem")
    out.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return out


class _Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    requests: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )
        last = body["messages"][-1]["content"]
        data = json.dumps(
            {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": f"heard {last}"}}
                ]
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@dataclass
class Provider:
    port: int
    requests: list[dict[str, Any]]

    @property
    def base_url(self) -> str:
        return f"https://localhost:{self.port}/v1"


@pytest.fixture
def provider(test_ca: CA) -> Iterator[Provider]:
    """An OpenAI-compatible provider over HTTPS on loopback, trusted only through ``test_ca``."""
    _Completions.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(test_ca.cert_pem, test_ca.key_pem)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield Provider(server.server_address[1], _Completions.requests)
    server.shutdown()
    server.server_close()


ECHO = r"""
import socket, sys, threading
def serve(ls):
    while True:
        c, _ = ls.accept()
        def one(c=c, port=ls.getsockname()[1]):
            data = c.recv(4096)
            c.sendall(b"port %d: " % port + data)
            c.close()
        threading.Thread(target=one, daemon=True).start()
socks = []
for port in sys.argv[2:]:
    ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((sys.argv[1], int(port))); ls.listen(16); socks.append(ls)
for ls in socks[1:]:
    threading.Thread(target=serve, args=(ls,), daemon=True).start()
print("ready", flush=True)
serve(socks[0])
"""


@dataclass
class Public:
    address: str
    ports: tuple[int, int]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def public() -> Iterator[Public]:
    """A host on an address of no private range, in a network namespace of its own."""
    tag = f"lnkp{os.getpid() % 100000}"
    n = os.getpid() % 60
    here, there = f"11.0.0.{n * 4 + 1}", f"11.0.0.{n * 4 + 2}"
    subprocess.run(["ip", "netns", "del", tag], capture_output=True)
    subprocess.run(["ip", "link", "del", f"{tag}h"], capture_output=True)
    _ip("netns", "add", tag)
    server: subprocess.Popen[str] | None = None
    try:
        _ip("link", "add", f"{tag}h", "type", "veth", "peer", "name", "eth0", "netns", tag)
        _ip("addr", "add", f"{here}/30", "dev", f"{tag}h")
        _ip("link", "set", f"{tag}h", "up")
        _ip("-n", tag, "addr", "add", f"{there}/30", "dev", "eth0")
        _ip("-n", tag, "link", "set", "eth0", "up")
        _ip("-n", tag, "link", "set", "lo", "up")
        ports = (8022, 8023)
        server = subprocess.Popen(
            ["ip", "netns", "exec", tag, sys.executable, "-c", ECHO, there, *map(str, ports)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield Public(there, ports)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", f"{tag}h"], capture_output=True)
        subprocess.run(["ip", "netns", "del", tag], capture_output=True)


class ProxyProcess:
    def __init__(self, proc: subprocess.Popen[bytes], net: Path, log: Path) -> None:
        self.proc, self.net, self.log_path = proc, net, log

    @property
    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture
def proxy_process(tmp_path: Path) -> Iterator[Callable[..., ProxyProcess]]:
    """proxy_process(grants, hosts={name: address}): ``python -m lnk.runtime.proxy``, running.

    With ``hosts``, the proxy runs in a mount namespace of its own whose
    /etc/hosts maps those names, so its real resolver answers with them.
    """
    started: list[ProxyProcess] = []

    def start(grants: Path, hosts: dict[str, str] | None = None) -> ProxyProcess:
        net = tmp_path / f"net{len(started)}"
        net.mkdir(mode=0o700)
        log = tmp_path / f"proxy{len(started)}.log"
        cmd = [sys.executable, "-m", "lnk.runtime.proxy", str(net / "proxy.sock"), str(grants)]
        if hosts:
            hf = tmp_path / f"hosts{len(started)}"
            hf.write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in hosts.items()))
            cmd = ["unshare", "-m", "sh", "-c", f'mount --bind {hf} /etc/hosts && exec "$@"', "-"]
            cmd += [sys.executable, "-m", "lnk.runtime.proxy", str(net / "proxy.sock"), str(grants)]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        p = ProxyProcess(proc, net, log)
        started.append(p)
        deadline = time.monotonic() + 20
        while "listening" not in p.log:
            assert proc.poll() is None, p.log
            assert time.monotonic() < deadline, p.log
            time.sleep(0.02)
        return p

    yield start
    for p in started:
        p.proc.terminate()
        p.proc.wait(timeout=10)


def connect_through(sock_path: Path, target: str, payload: bytes) -> bytes:
    """CONNECT target through the proxy at sock_path (outside any sandbox), send, read all."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect(str(sock_path))
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        s.close()
        return head
    _, _, rest = head.partition(b"\r\n\r\n")
    s.sendall(payload)
    data = rest
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return data
