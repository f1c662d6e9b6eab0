"""Real SSH test hosts: network namespaces, each running its own sshd.

Each host is "a machine" for lnk: its own network namespace and address on a
private bridge (10.201.N.0/24), its own sshd with its own host key, and its own
HOME.  The filesystem and the users are shared with this machine, so a host
logs in as root (the only user that can run this Python: the interpreter lives
under /root, mode 700) and gets its own HOME and PATH from ``SetEnv`` in its
sshd_config.  lnk finds every path from ``$HOME``, so that is a separate
machine as far as lnk is concerned.  (The shell's working directory is still
root's home directory, so nothing here uses relative paths.)

* ``hostA``, ``hostB``: lnk installed (``$HOSTDIR/bin/lnk`` runs this
  interpreter's ``-m lnk``).
* ``hostC``: a bare box: ``python3`` (this interpreter), no ``lnk`` on PATH,
  so ``lnk box add`` has to install it (into ``~/.local``, first on PATH).
* ``hostDown``: an alias whose port refuses connections.

Use ``Hosts.env()`` (``LNK_SSH_COMMAND="ssh -F <config>"``) for lnk, or
``Hosts.ssh(...)`` directly.  Everything is named ``lnkt<pid>...`` so that
concurrent sessions don't collide, and a session cleans up what a crashed one
left (namespaces, bridge, sshd) at setup.  Needs root, iproute2 and
openssh-server (``apt-get install -y iproute2 openssh-server openssh-client``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PREFIX = "lnkt"
HOST_NAMES = ("hostA", "hostB", "hostC")
WITH_LNK = ("hostA", "hostB")


@dataclass
class Host:
    name: str
    netns: str
    address: str
    dir: Path
    home: Path
    bin: Path
    veth: str = ""
    sshd: subprocess.Popen[bytes] | None = None


@dataclass
class Hosts:
    root: Path
    bridge: str
    bridge_address: str
    ssh_config: Path
    hosts: dict[str, Host] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    @property
    def ssh_command(self) -> str:
        return f"ssh -F {self.ssh_config}"

    def env(self, home: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["LNK_SSH_COMMAND"] = self.ssh_command
        if home is not None:
            env["HOME"] = str(home)
        return env

    def ssh(self, host: str, command: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["ssh", "-F", str(self.ssh_config), host, "--", command],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            **kw,
        )  # type: ignore[call-overload]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale() -> None:
    """Remove namespaces and bridges of sessions that are gone (a crashed run)."""
    pat = re.compile(rf"^{PREFIX}(\d+)")
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = pat.match(name)
        if m and not _alive(int(m.group(1))):
            _delete_netns(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = pat.match(name)
        if m and not _alive(int(m.group(1))):
            _ip("link", "del", name, check=False)


def _delete_netns(name: str) -> None:
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", name, check=False)


def _pick_subnet() -> int:
    used = _ip("-o", "-4", "addr", "show", check=False).stdout
    start = os.getpid() % 250 + 1
    for i in range(250):
        n = (start + i - 1) % 250 + 1
        if f" 10.201.{n}." not in used:
            return n
    raise RuntimeError("no free 10.201.N.0/24 subnet for the test hosts")


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
    )


def _write_exec(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _wait_port(
    address: str, port: int, proc: subprocess.Popen[bytes], log: Path, deadline: float = 20.0
) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            s.settimeout(1.0)
            try:
                s.connect((address, port))
                if s.recv(4).startswith(b"SSH-"):
                    return
            except OSError:
                pass
        time.sleep(0.02)  # polling: the deadline above bounds it
    raise RuntimeError(f"sshd on {address} did not answer: {log.read_text()[-2000:]}")


def start_hosts(root: Path, tag: str = "") -> Hosts:
    """Create the hosts under ``root``; call :func:`stop_hosts` (always) after.

    ``tag`` (one letter) lets a second set run in the same session beside the first.
    """
    if os.geteuid() != 0:
        raise RuntimeError("the SSH test hosts need root (network namespaces)")
    for tool in ("ip", "ssh", "ssh-keygen", SSHD):
        if not shutil.which(tool):
            raise RuntimeError(
                f"{tool} is missing: apt-get install -y iproute2 openssh-server openssh-client"
            )
    clean_stale()
    pid = os.getpid()
    n = _pick_subnet()
    bridge = f"{PREFIX}{pid}{tag}br"
    hosts = Hosts(
        root=root, bridge=bridge, bridge_address=f"10.201.{n}.1", ssh_config=root / "ssh_config"
    )
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    client_key = root / "client_key"
    _keygen(client_key)
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{hosts.bridge_address}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        known: list[str] = []
        cfg: list[str] = []
        for i, name in enumerate(HOST_NAMES):
            host = _make_host(hosts, name, f"{pid}{tag}", n, i + 2, client_key)
            pub = (host.dir / "ssh_host_ed25519_key.pub").read_text().split()
            known.append(f"{host.address} {pub[0]} {pub[1]}")
            cfg += [f"Host {name}", f"  HostName {host.address}", ""]
        cfg += ["Host hostDown", f"  HostName {hosts.bridge_address}", "  Port 1", ""]
        cfg += [
            "Host *",
            "  User root",
            f"  IdentityFile {client_key}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {root / 'known_hosts'}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "  CheckHostIP no",
            "  ConnectTimeout 10",
            "  LogLevel ERROR",
            "",
        ]
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        hosts.ssh_config.write_text("\n".join(cfg))
        for host in hosts.hosts.values():
            _start_sshd(host)
    except BaseException:
        stop_hosts(hosts)
        raise
    return hosts


def _pythonpath() -> str:
    """The lnk under test runs on the hosts too (a worktree's PYTHONPATH, not the install)."""
    value = os.environ.get("PYTHONPATH", "")
    if not value or any(c.isspace() or c == '"' for c in value):
        return ""
    return f" PYTHONPATH={value}"


def _make_host(hosts: Hosts, name: str, pid: str, n: int, last: int, client_key: Path) -> Host:
    letter = name[-1].lower()
    netns = f"{PREFIX}{pid}{letter}"
    veth = f"{PREFIX}{pid}v{letter}"
    d = hosts.root / name
    host = Host(
        name=name,
        netns=netns,
        address=f"10.201.{n}.{last}",
        dir=d,
        home=d / "home",
        bin=d / "bin",
        veth=veth,
    )
    hosts.hosts[name] = host
    host.home.mkdir(parents=True)
    host.bin.mkdir()
    _ip("netns", "add", netns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    _ip("link", "set", veth, "master", hosts.bridge, "up")
    _ip("-n", netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
    _ip("-n", netns, "link", "set", "eth0", "up")
    _ip("-n", netns, "link", "set", "lo", "up")
    _keygen(d / "ssh_host_ed25519_key")
    shutil.copy(f"{client_key}.pub", d / "authorized_keys")
    os.symlink(sys.executable, host.bin / "python3")
    if name in WITH_LNK:
        _write_exec(host.bin / "lnk", f'#!/bin/sh\nexec {sys.executable} -m lnk "$@"\n')
    path = f"{host.home}/.local/bin:{host.bin}:/usr/local/bin:/usr/bin:/bin"
    (d / "sshd_config").write_text(
        "\n".join(
            [
                f"ListenAddress {host.address}",
                f"HostKey {d / 'ssh_host_ed25519_key'}",
                f"PidFile {d / 'sshd.pid'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",  # keys under /tmp would fail the ownership checks
                "PrintMotd no",
                "X11Forwarding no",
                f"SetEnv HOME={host.home} PATH={path} LNK_TESTING=1{_pythonpath()}",
                "AcceptEnv LNK_FAULT",
                "",
            ]
        )
    )
    return host


def _start_sshd(host: Host) -> None:
    log = host.dir / "sshd.log"
    with log.open("wb") as f:
        host.sshd = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                host.netns,
                SSHD,
                "-D",
                "-e",
                "-f",
                str(host.dir / "sshd_config"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=f,
        )
    _wait_port(host.address, 22, host.sshd, log)


def stop_hosts(hosts: Hosts) -> None:
    """Stop every sshd and delete the namespaces and bridge; safe to call twice."""
    for host in hosts.hosts.values():
        if host.sshd is not None and host.sshd.poll() is None:
            host.sshd.terminate()
            try:
                host.sshd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                host.sshd.kill()
                host.sshd.wait()
        _ip("link", "del", host.veth, check=False)
        _delete_netns(host.netns)
    _ip("link", "del", hosts.bridge, check=False)


@contextlib.contextmanager
def running_hosts(root: Path, tag: str = "") -> Iterator[Hosts]:
    hosts = start_hosts(root, tag)
    try:
        yield hosts
    finally:
        stop_hosts(hosts)


def run_lnk(*args: str, env: dict[str, str], stdin: bytes = b"") -> tuple[int, str, str]:
    """Run ``python -m lnk ARGS`` as its own process, as a person would: (code, out, err)."""
    r = subprocess.run(
        [sys.executable, "-m", "lnk", *args], env=env, input=stdin, capture_output=True, timeout=300
    )
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def reset_homes(hosts: Hosts) -> None:
    """Each host as it was made: its agents stopped, its HOME emptied (a test's boxes,
    an lnk it installed in ~/.local, its keys), so tests share one set of hosts."""
    for h in hosts.hosts.values():
        for pidfile in (h.home / ".lnk" / "agents").glob("*/runner.pid"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(pidfile.read_text().strip())
                if b"lnk.runtime.runner" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if h.home.is_dir():
            for child in h.home.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
