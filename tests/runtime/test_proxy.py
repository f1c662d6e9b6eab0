"""The agent's proxy: its policy, and the sandbox's only way out, with real bubblewrap and servers."""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lnk.agents import grants, registry
from lnk.agents.layout import Machine
from lnk.runtime.egress import Policy
from lnk.runtime.startup import proxy_env
from lnk.sandbox.bwrap import check_bwrap, sandboxed
from tests.runtime.conftest import ProxyProcess, Public, connect_through

INSIDE_PORT = 3128

# run inside the sandbox: CONNECT argv[1] through the proxy's relay, send argv[2], print the reply
CONNECT = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", PORT), timeout=20)
s.sendall(b"CONNECT " + sys.argv[1].encode() + b" HTTP/1.1\r\n\r\n")
data = b""
while b"\r\n\r\n" not in data:
    c = s.recv(4096)
    if not c: break
    data += c
head, _, rest = data.partition(b"\r\n\r\n")
if head.startswith(b"HTTP/1.1 200"):
    s.sendall(sys.argv[2].encode())
    while True:
        c = s.recv(4096)
        if not c: break
        rest += c
    print(rest.decode())
else:
    print(head.decode().splitlines()[0])
""".replace("PORT", str(INSIDE_PORT))


def spec(**kw: object) -> grants.Spec:
    return grants.Spec(**kw)  # type: ignore[arg-type]


OWN = {ipaddress.ip_address("192.0.2.7")}  # "this machine" for the policy's unit tests


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "10.1.2.3",
        "::ffff:10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "fe80::1",
        "fd00::1",
        "0.0.0.0",
        "192.0.2.7",
        "2002:a01:203::1",  # 6to4 of 10.1.2.3
        "64:ff9b::a01:203",  # NAT64 of 10.1.2.3
    ],
)
def test_private_and_own_addresses_are_refused_even_with_every_host(host: str) -> None:
    d = Policy(spec(hosts=["*"]), OWN).decide(host, 443)
    assert not d.allowed and ("private" in d.why or "this machine" in d.why), d.why


def test_a_public_address_is_allowed_on_80_and_443_only() -> None:
    p = Policy(spec(hosts=["*"]), OWN)
    assert p.decide("11.0.0.9", 443).allowed
    assert p.decide("11.0.0.9", 80).allowed
    d = p.decide("11.0.0.9", 22)
    assert not d.allowed and "--tcp 11.0.0.9:22" in d.why


def test_denials_come_before_allows_and_a_wildcard_is_not_its_apex() -> None:
    p = Policy(spec(hosts=["11.0.0.9", "!11.0.0.9"]), OWN)
    assert "denied" in p.decide("11.0.0.9", 443).why
    assert grants.host_listed(["*.example.com"], "api.example.com") is True
    assert grants.host_listed(["*.example.com"], "example.com") is None
    assert grants.host_listed(["*", "!evil.example"], "EVIL.example.") is False


def test_grants_name_this_machine_and_the_lan() -> None:
    p = Policy(spec(hosts=[], ports=[8080], lan=["10.1.0.0/16"]), OWN)
    assert p.decide("127.0.0.1", 8080).allowed
    assert not p.decide("127.0.0.1", 8081).allowed
    assert p.decide("10.1.2.3", 443).allowed
    assert not p.decide("10.2.0.1", 443).allowed
    assert not p.decide("10.1.2.3", 22).allowed  # a LAN host reaches 80/443 or a named endpoint


def test_allow_and_deny_mirror_each_other() -> None:
    s = grants.Spec()
    grants.change(s, "host", "evil.example", allow=False)
    assert s.hosts == ["*", "!evil.example"]
    grants.change(s, "host", "evil.example", allow=True)
    assert s.hosts == ["*", "evil.example"]
    grants.change(s, "tcp", "GitHub.com:22", allow=True)
    assert s.tcp == ["github.com:22"]
    grants.change(s, "tcp", "github.com:22", allow=False)
    assert s.tcp == []
    back = grants.spec_from_data(grants.spec_to_data(s))
    assert back.hosts == s.hosts and back.tcp == []


# -- in a real sandbox, through a real proxy process ------------------------------------


@pytest.fixture
def agent(home: Path) -> registry.Agent:
    return registry.create(Machine.current(), "main")


def in_sandbox(agent: registry.Agent, net: Path, *argv: str) -> str:
    inner = [
        sys.executable,
        "-m",
        "lnk.sandbox.inrelay",
        str(INSIDE_PORT),
        "/run/lnk/net/proxy.sock",
        "--",
        *argv,
    ]
    cmd = sandboxed(
        agent,
        inner,
        bwrap=check_bwrap(),
        runtime=False,
        net_dir=net,
        env=proxy_env(INSIDE_PORT),
    )
    p = cmd.run(capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_the_sandbox_reaches_only_what_its_grants_name(
    agent: registry.Agent,
    public: Public,
    proxy_process: Callable[..., ProxyProcess],
    tmp_path: Path,
) -> None:
    g = tmp_path / "sandbox.toml"
    grants.write_spec(
        g, spec(hosts=["svc.test", "*.corp.test"], tcp=[f"svc.test:{public.ports[0]}"])
    )
    names = {
        "svc.test": public.address,
        "other.test": public.address,
        "inner.corp.test": "10.1.2.3",
        "loop.corp.test": "127.0.0.1",
        "mapped.corp.test": "::ffff:127.0.0.1",
    }
    px = proxy_process(g, names)
    p0, p1 = public.ports

    def through(target: str) -> str:
        return in_sandbox(agent, px.net, sys.executable, "-c", CONNECT, target, "hello")

    # the endpoint named with --tcp answers; its other port and an unlisted name don't
    assert through(f"svc.test:{p0}") == f"port {p0}: hello"
    assert through(f"svc.test:{p1}").startswith("HTTP/1.1 403")
    assert through(f"other.test:{p0}").startswith("HTTP/1.1 403")
    # an allowed name resolving to this machine or a private network is refused
    assert through("inner.corp.test:443").startswith("HTTP/1.1 403")
    assert through("loop.corp.test:443").startswith("HTTP/1.1 403")
    assert through("mapped.corp.test:443").startswith("HTTP/1.1 403")
    # around the proxy there is no way at all: the sandbox has only lo
    probe = sandboxed(
        agent,
        [sys.executable, "-m", "lnk.harness", "probe-connect", public.address, str(p0)],
        bwrap=check_bwrap(),
        runtime=False,
    )
    assert probe.run(timeout=60).returncode == 1
    log = px.log
    assert f"allowed CONNECT svc.test:{p0}: sent 5 B, received {len(f'port {p0}: hello')} B" in log
    assert f"refused CONNECT svc.test:{p1}: port {p1} of svc.test is not granted" in log
    assert f"refused CONNECT other.test:{p0}: other.test is not on the agent's" in log
    assert "refused CONNECT inner.corp.test:443: inner.corp.test is on a private network" in log
    assert "refused CONNECT loop.corp.test:443: loop.corp.test is this machine" in log
    assert "refused CONNECT mapped.corp.test:443: mapped.corp.test is this machine" in log
    # a grant applies at once: the proxy re-reads the file at the next connection
    s = grants.read_spec(g)
    grants.change(s, "tcp", f"svc.test:{p1}", allow=True)
    grants.write_spec(g, s)
    assert connect_through(px.net / "proxy.sock", f"svc.test:{p1}", b"again") == (
        f"port {p1}: again".encode()
    )


def test_plain_http_is_sent_on_in_origin_form(
    public: Public, proxy_process: Callable[..., ProxyProcess], tmp_path: Path
) -> None:
    import socket

    g = tmp_path / "sandbox.toml"
    p0 = public.ports[0]
    grants.write_spec(g, spec(hosts=["svc.test"], tcp=[f"svc.test:{p0}"]))
    px = proxy_process(g, {"svc.test": public.address, "evil.test": public.address})

    def ask(url: str) -> bytes:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(str(px.net / "proxy.sock"))
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\nProxy-Connection: keep-alive\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        s.close()
        return data

    # the echo server shows what reached it: the request in origin form, the proxy's headers gone
    got = ask(f"http://svc.test:{p0}/a?b=1")
    assert got.startswith(f"port {p0}: GET /a?b=1 HTTP/1.1\r\n".encode()), got
    assert b"Proxy-Connection" not in got and b"Connection: close" in got
    assert ask(f"http://evil.test:{p0}/").startswith(b"HTTP/1.1 403")
    assert ask("http://svc.test:bad/").startswith(b"HTTP/1.1 400")
    assert f"allowed GET svc.test:{p0}" in px.log and f"refused GET evil.test:{p0}" in px.log
