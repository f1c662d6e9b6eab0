"""The agent's sandbox on Linux: bubblewrap.

The sandbox's shape (see ``docs/harness.md``):

* a fresh root (tmpfs) with the system read-only: /usr, the /bin /lib /sbin
  links, the parts of /etc a program needs (:data:`ETC_SHOWN`: never
  ``shadow``, ``ssh/``, ``sudoers``, ``ssl/private``), a ``passwd`` and
  ``group`` of the sandbox's own, and the Python runtime (``sys.prefix``,
  ``sys.base_prefix``) and the ``lnk`` package's own folder (never the
  checkout around it);
* the agent's folders at their own paths: ``Home/`` and ``Agent/chats``,
  ``memory``, ``schedule`` writable; ``Agent/instructions``, ``skills`` and
  ``Config/`` read-only (an agent can't widen its own grants).  Nothing else
  of HOME: not ``~/.config/lnk``, ``~/.lnk``, ``~/.ssh`` nor other agents,
  but what its ``[files]`` grants show (:mod:`lnk.sandbox.files`);
* ``/run/lnk/key`` and ``/run/lnk/harness.json`` read-only (the endpoint key
  and the harness's config) and ``/run/lnk/net`` = ``~/.lnk/agents/.net/<id>``,
  where the harness serves its endpoint on a unix socket;
* every namespace unshared (its own network with only ``lo``, pid, ipc, uts,
  user, cgroup), a private /tmp, ``--die-with-parent``, ``--new-session`` and
  ``--clearenv`` with only the variables it needs;
* no capability, ever (``--cap-drop ALL``): run by root, the sandbox is a user
  namespace whose user is :data:`SANDBOX_UID`, not root, and makes no user
  namespace of its own (``--disable-userns``); a seccomp filter refuses the
  system calls no harness needs (:mod:`lnk.sandbox.seccomp`); open files,
  memory and processes are capped (:mod:`lnk.sandbox.limits`).

There is no fallback: if bubblewrap is missing or can't run,
:func:`check_bwrap` raises :class:`SandboxUnavailable`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lnk
from lnk.errors import SandboxUnavailable
from lnk.sandbox import seccomp
from lnk.sandbox.files import file_grants, under

if TYPE_CHECKING:
    from lnk.agents.registry import Agent

RUN_DIR = "/run/lnk"
KEY_PATH = f"{RUN_DIR}/key"
CONFIG_PATH = f"{RUN_DIR}/harness.json"
NET_DIR = f"{RUN_DIR}/net"
SOCKET_NAME = "endpoint.sock"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
RW_AGENT_DIRS = ("chats", "memory", "schedule")
RO_AGENT_DIRS = ("instructions", "skills")
PROXY_SOCKET = "proxy.sock"
# the parts of /etc a program needs: names, certificates, libraries, locales, terminals
ETC_SHOWN = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "crypto-policies",
    "debian_version",
    "fonts",
    "gai.conf",
    "host.conf",
    "hostname",
    "hosts",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "locale.conf",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "pki/tls/certs",
    "pki/ca-trust",
    "profile",
    "protocols",
    "python3",
    f"python3.{sys.version_info.minor}",
    "resolv.conf",
    "services",
    "shells",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
)
SANDBOX_UID = 1000  # the sandbox's user when root runs it: never root inside

_probed: set[str] = set()

FIX_HINT = (
    "install bubblewrap (apt-get install bubblewrap); on Ubuntu 24.04 and later "
    "also allow it user namespaces with an AppArmor profile for bwrap; or, on a "
    "machine you trust, start the agent with --no-sandbox"
)


def find_bwrap(path: str | None = None) -> str:
    """The bwrap program on ``path`` (default: $PATH), or SandboxUnavailable."""
    found = shutil.which("bwrap", path=path if path is not None else os.environ.get("PATH"))
    if not found:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: the agent's sandbox can't be made", hint=FIX_HINT
        )
    return found


def check_bwrap(path: str | None = None) -> str:
    """Make sure bubblewrap can run a sandbox here; returns its path.

    Probes once per process (``bwrap --ro-bind / / --unshare-all true``).
    ``path`` is the PATH to look in (default: the environment's).
    """
    bwrap = find_bwrap(path)
    if bwrap in _probed:
        return bwrap
    try:
        proc = subprocess.run(
            [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxUnavailable(f"bubblewrap ({bwrap}) can't run: {e}", hint=FIX_HINT) from e
    if proc.returncode != 0:
        why = proc.stderr.decode("utf-8", "replace").strip()[:500] or f"exit {proc.returncode}"
        raise SandboxUnavailable(
            f"bubblewrap ({bwrap}) can't make a sandbox here: {why}", hint=FIX_HINT
        )
    _probed.add(bwrap)
    return bwrap


def package_dir() -> Path:
    """The ``lnk`` package's own folder (an editable install's is in its checkout)."""
    return Path(lnk.__file__).resolve().parent


def python_paths() -> list[str]:
    """What the harness's Python needs read-only: its prefixes and the lnk package's folder
    (only the package: never the checkout around an editable install's)."""
    out: list[str] = []
    for p in (
        sys.prefix,
        sys.base_prefix,
        os.path.realpath(sys.prefix),
        os.path.realpath(sys.base_prefix),
        str(package_dir()),
    ):
        if p and os.path.isdir(p) and not under(p, ["/usr", *out]):
            out.append(p)
    return out


def sandbox_python() -> str:
    """This Python as the sandbox can run it: its own path where the sandbox shows that
    (a virtualenv's, under its prefix), else the program it links to."""
    exe = sys.executable
    if under(exe, ["/usr", *python_paths()]):
        return exe
    return os.path.realpath(exe)


def sandbox_env(agent: Agent, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        "HOME": str(agent.folders.home),
        "PATH": SANDBOX_PATH,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(package_dir().parent),
        "LNK_SANDBOXED": "1",
    }
    env.update(extra or {})
    return env


def _etc_args() -> list[str]:
    """/etc as the sandbox shows it: only :data:`ETC_SHOWN`, links kept as links."""
    a: list[str] = ["--dir", "/etc"]
    for name in ETC_SHOWN:
        src = f"/etc/{name}"
        if os.path.islink(src):
            a += ["--symlink", os.readlink(src), src]
        elif os.path.exists(src):
            a += ["--ro-bind", src, src]
    return a


def _identity(home: str) -> tuple[int, int, bytes, bytes]:
    """The sandbox's user and group IDs, and its /etc/passwd and /etc/group."""
    root = os.geteuid() == 0
    uid, gid = (SANDBOX_UID, SANDBOX_UID) if root else (os.getuid(), os.getgid())
    passwd = f"agent:x:{uid}:{gid}:lnk agent:{home}:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
    group = f"agent:x:{gid}:\nnogroup:x:65534:\n"
    return uid, gid, passwd.encode(), group.encode()


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# bubblewrap itself starts with this environment alone: its own init process inside the
# sandbox keeps the environment it was started with (readable as /proc/1/environ in
# there), so lnk's own (a provider's key in a variable, say) never reaches it
LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


@dataclass
class Sandboxed:
    """A command ready to run in the sandbox: its argv and the descriptors bubblewrap reads
    (the seccomp filter, /etc/passwd, /etc/group), handed over at the start and closed here."""

    argv: list[str]
    fds: list[int] = field(default_factory=list)

    def popen(self, **kw: Any) -> subprocess.Popen[Any]:
        kw.setdefault("env", LAUNCH_ENV)
        try:
            return subprocess.Popen(self.argv, pass_fds=self.fds, **kw)
        finally:
            self.close()

    def run(self, **kw: Any) -> subprocess.CompletedProcess[Any]:
        kw.setdefault("env", LAUNCH_ENV)
        try:
            return subprocess.run(self.argv, pass_fds=self.fds, **kw)
        finally:
            self.close()

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


def sandboxed(
    agent: Agent,
    inner_cmd: list[str],
    *,
    bwrap: str = "bwrap",
    env: dict[str, str] | None = None,
    runtime: bool = True,
    net_dir: Path | None = None,
    network_mode: str = "proxy",
    files: tuple[list[str], list[str]] = ([], []),
    prefix: list[str] | None = None,
    harness: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
) -> Sandboxed:
    """The full command that runs ``inner_cmd`` in the agent's sandbox.

    ``env`` adds variables to the few the sandbox sets.  ``runtime`` binds the
    endpoint key, the harness config and the net folder under /run/lnk (the
    runner makes them; set False for a command run beside the agent), or
    ``net_dir`` alone binds a folder at /run/lnk/net.  ``network_mode`` "host"
    shares this machine's network (``[network] mode = "host"``); ``files`` are
    the ``[files]`` read and write grants (:func:`file_grants`); ``prefix``
    runs before bubblewrap (its limits: :func:`lnk.sandbox.limits.launch_prefix`);
    ``harness`` is an adapter's harness's folders (read-only: its install; writable: its
    home under ``Agent/harness``), as :mod:`lnk.harnesses.contract` checked them.
    """
    if not inner_cmd or inner_cmd[0].startswith("-"):
        raise ValueError("the sandboxed command must be a program and its arguments")
    folders = agent.folders
    outside, covers, inside = file_grants(agent, files[0], files[1], strict=False)
    uid, gid, passwd, group = _identity(str(folders.home))
    fds = [
        _memfd("lnk-seccomp", seccomp.compiled()),
        _memfd("lnk-passwd", passwd),
        _memfd("lnk-group", group),
    ]
    a: list[str] = [*(prefix or []), bwrap, "--unshare-all", "--unshare-user"]
    a += ["--uid", str(uid), "--gid", str(gid), "--disable-userns", "--cap-drop", "ALL"]
    a += ["--die-with-parent", "--new-session", "--clearenv", "--seccomp", str(fds[0])]
    if network_mode == "host":
        a.append("--share-net")
    # the system, read-only, on a fresh tmpfs root
    a += ["--ro-bind", "/usr", "/usr"]
    for p in SYSTEM_LINKS:
        if os.path.islink(p):
            a += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            a += ["--ro-bind", p, p]
    a += _etc_args()
    a += ["--ro-bind-data", str(fds[1]), "/etc/passwd", "--ro-bind-data", str(fds[2]), "/etc/group"]
    a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/var/tmp"]
    for p in python_paths():
        a += ["--ro-bind", p, p]
    # [files] grants of yours, then what they would show of the hidden, covered
    a += outside + covers
    # the agent's folders (after /tmp's tmpfs: a HOME under /tmp stays reachable)
    a += ["--bind", str(folders.home), str(folders.home)]
    a += inside
    for d in RW_AGENT_DIRS:
        a += ["--bind", str(folders.agent / d), str(folders.agent / d)]
    for d in RO_AGENT_DIRS:
        a += ["--ro-bind", str(folders.agent / d), str(folders.agent / d)]
    for p in harness[0]:
        a += ["--ro-bind", p, p]
    for p in harness[1]:
        a += ["--bind", p, p]
    a += ["--ro-bind", str(folders.config), str(folders.config)]
    if runtime:
        a += [
            "--dir",
            RUN_DIR,
            "--ro-bind",
            str(agent.runtime / "key"),
            KEY_PATH,
            "--ro-bind",
            str(agent.runtime / "harness.json"),
            CONFIG_PATH,
            "--bind",
            str(agent.net),
            NET_DIR,
        ]
    elif net_dir is not None:
        a += ["--dir", RUN_DIR, "--bind", str(net_dir), NET_DIR]
    a += ["--remount-ro", "/"]  # the root made here (/etc, /run, ...) read-only once built
    for k, v in sandbox_env(agent, env).items():
        a += ["--setenv", k, v]
    a += ["--chdir", str(folders.home)]
    return Sandboxed(a + list(inner_cmd), fds)
