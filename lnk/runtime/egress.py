"""Where the agent's proxy lets the agent go: names, addresses and its grants.

:class:`Policy` decides one destination (a host and a port) from the agent's
grants (:class:`lnk.agents.grants.Spec`); :class:`LivePolicy` keeps one up to
date with the agent's grants file:

* a name is compared as it is resolved: only an ASCII host name (LDH labels,
  an IDNA name in its ``xn--`` form) or an address literal is taken, so no
  two spellings of one name (a soft hyphen, a full-width letter, a trailing
  dot) can pass a denial that its resolved form would meet;
* denials come before allows; a denied name's addresses are denied too
  (whichever name reaches them), as are denied address literals;
* names reach ports 80 and 443; any other port only as a named endpoint
  (``--tcp host:port``);
* this machine (every address of its own, loopback, the unspecified address)
  only on a port granted by number (``--port``), never through a LAN grant;
* every special-purpose range of IANA's IPv4 and IPv6 registries that is not
  globally reachable (private, shared, documentation, benchmarking,
  transition and deprecated ranges, multicast) only as a LAN grant names it;
  an address carried inside another (IPv4-mapped and -compatible, 6to4,
  NAT64, Teredo) is judged as the address it carries too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lnk.agents.grants import Spec, host_listed, norm_host, read_spec
from lnk.errors import LnkError

STD_PORTS = (80, 443)
DENIED_TTL_S = 30.0
OWN_TTL_S = 10.0  # this machine's addresses are looked up again after this

AddrInfo = tuple[socket.AddressFamily, tuple[str, int] | tuple[str, int, int, int]]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# IANA's special-purpose address registries (IPv4 and IPv6), the ranges not globally
# reachable, with multicast: never reached unless a LAN grant names them
SPECIAL_NETS = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",  # shared address space (CGNAT)
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, cloud metadata
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the limited broadcast address
        "::/96",  # unspecified, loopback, IPv4-compatible (deprecated)
        "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation
        "100::/64",  # discard-only
        "100:0:0:1::/64",  # dummy prefix
        "2001::/23",  # IETF protocol assignments: Teredo, benchmarking, ORCHID, ...
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation
        "5f00::/16",  # segment routing (SRv6) SIDs
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
]
NAT64 = ipaddress.ip_network("64:ff9b::/96")
V4COMPAT = ipaddress.ip_network("::/96")
TEREDO = ipaddress.ip_network("2001::/32")
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME_RE = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


def carried(ip: Address) -> list[Address]:
    """``ip`` and every IPv4 address an IPv6 form of it carries."""
    out: list[Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            out.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            out.append(ip.sixtofour)
        if ip in TEREDO and ip.teredo is not None:
            out += list(ip.teredo)
        if ip in NAT64 or (ip in V4COMPAT and int(ip) > 1):
            out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return out


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
    """``own`` (this machine), ``private`` (a special-purpose range) or ``public``."""
    forms = carried(ip)
    if any(a in own or a.is_loopback or a.is_unspecified for a in forms):
        return "own"
    if any(a.version == n.version and a in n for a in forms for n in SPECIAL_NETS):
        return "private"
    return "public"


def host_form(host: str) -> str | None:
    """The host as the proxy compares and resolves it (lower case, no trailing dot or
    brackets), or None when it is neither an address nor an ASCII host name."""
    h = norm_host(host)
    if _is_ip(h):
        return str(ipaddress.ip_address(h))
    if not h.isascii() or len(h) > 253 or not _NAME_RE.match(h):
        return None
    return h


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
        self.denied = [h[1:] for h in spec.hosts if h.startswith("!") and "*" not in h]
        self._denied_addrs: tuple[float, set[Address]] | None = None

    def _lan_covers(self, host: str, ip: Address) -> bool:
        return host in self.lan_names or any(
            a.version == n.version and a in n for n in self.lan_nets for a in carried(ip)
        )

    def denied_addresses(self) -> set[Address]:
        """The addresses of the denied names and the denied literals (resolved again after
        ``DENIED_TTL_S``)."""
        now = time.monotonic()
        if self._denied_addrs is None or now - self._denied_addrs[0] > DENIED_TTL_S:
            out: set[Address] = set()
            for h in self.denied:
                if _is_ip(h):
                    out.add(ipaddress.ip_address(h))
                    continue
                for _, sa in _resolve(h, 443):
                    out.add(ipaddress.ip_address(sa[0].split("%")[0]))
            self._denied_addrs = (now, out)
        return self._denied_addrs[1]

    def decide(self, host: str, port: int) -> Decision:
        h = host_form(host)
        if h is None:
            return Decision(
                False, "not an ASCII host name or address (an IDNA name goes in its xn-- form)"
            )
        if not 0 < port < 65536:
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
        denied = self.denied_addresses() if self.denied else set()
        for _, sa in addrs:
            ip = ipaddress.ip_address(sa[0].split("%")[0])
            if any(a in denied for a in carried(ip)):
                return Decision(
                    False, f"{h} is {ip}, an address of a host the agent's [internet] hosts deny"
                )
        why = ""
        ok: list[AddrInfo] = []
        for fam, sa in addrs:
            ip = ipaddress.ip_address(sa[0].split("%")[0])
            kind = classify(ip, self.own)
            if kind == "own":
                if port in self.ports:
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


class LivePolicy:
    """The :class:`Policy` of a grants file as it is now: the file re-read when it
    changed, this machine's own addresses looked up again every ``OWN_TTL_S``; a file
    that can't be read lets nothing out (and says so in ``log``)."""

    def __init__(self, grants: Path, log: Callable[[str], None]) -> None:
        self.grants = grants
        self._log = log
        self._lock = threading.Lock()
        self._policy: Policy | None = None
        self._stamp: tuple[int, int] | None = None
        self._own_at = 0.0

    def now(self) -> Policy:
        try:
            st = self.grants.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        with self._lock:
            fresh_own = time.monotonic() - self._own_at > OWN_TTL_S
            if self._policy is None or stamp != self._stamp or fresh_own:
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
                self._stamp = stamp
            return self._policy


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
