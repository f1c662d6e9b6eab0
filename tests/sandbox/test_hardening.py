"""The sandbox against the agent inside it (issue 22): each hole proved closed from inside.

Every test runs the real bubblewrap with the argv lnk builds; the ones "as a
user" run it as an unprivileged user (``setpriv``), with the argv lnk builds
when that user runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk.agents import grants, registry
from lnk.agents.layout import Machine
from lnk.sandbox import bwrap, limits
from lnk.sandbox.bwrap import check_bwrap, sandboxed
from lnk.sandbox.files import file_grants

NOBODY = 65534


@pytest.fixture
def agent(home: Path) -> registry.Agent:
    return registry.create(Machine.current(), "main")


def sh(agent: registry.Agent, script: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    cmd = sandboxed(agent, ["/bin/sh", "-c", script], bwrap=check_bwrap(), runtime=False, **kw)
    return cmd.run(capture_output=True, text=True, timeout=60)


def status_field(text: str, name: str) -> str:
    return next(
        line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(name)
    )


def test_root_runs_a_sandbox_with_no_capability_and_not_as_root(agent: registry.Agent) -> None:
    assert os.geteuid() == 0  # the suite runs as root, as CI does
    p = sh(agent, "cat /proc/self/status; id -u")
    assert p.returncode == 0, p.stderr
    for cap in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
        assert status_field(p.stdout, cap) == "0000000000000000", cap
    assert status_field(p.stdout, "Uid").split()[0] == str(bwrap.SANDBOX_UID)
    assert p.stdout.split()[-1] == str(bwrap.SANDBOX_UID)
    # the system call filter is loaded (mode 2: a filter)
    assert status_field(p.stdout, "Seccomp") == "2"


@pytest.fixture
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A HOME an unprivileged user owns, under a folder it can reach."""
    base = Path(f"/tmp/lnk-user-{os.getpid()}-{tmp_path.name}")
    base.mkdir(mode=0o755)
    monkeypatch.setenv("HOME", str(base / "home"))
    yield base / "home"
    shutil.rmtree(base, ignore_errors=True)


def test_a_user_runs_a_sandbox_with_no_capability(
    user_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = registry.create(Machine.current(), "main")
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(user_home)], check=True)
    # the argv lnk builds when that user runs it: its own IDs, and no Python of root's home
    for name in ("geteuid", "getuid", "getgid"):
        monkeypatch.setattr(os, name, lambda: NOBODY)
    monkeypatch.setattr(bwrap, "python_paths", lambda: [])
    cmd = sandboxed(
        a,
        ["/bin/sh", "-c", "cat /proc/self/status; touch $HOME/made"],
        bwrap=check_bwrap(),
        runtime=False,
    )
    monkeypatch.undo()
    cmd.argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd.argv]
    p = cmd.run(capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert status_field(p.stdout, "CapEff") == "0000000000000000"
    assert status_field(p.stdout, "CapBnd") == "0000000000000000"
    assert status_field(p.stdout, "Uid").split()[0] == str(NOBODY)
    assert status_field(p.stdout, "Seccomp") == "2"
    assert (a.folders.home / "made").exists()


def test_remount_umount_and_writes_to_read_only_binds_fail(agent: registry.Agent) -> None:
    f = agent.folders
    for script in (
        f"mount -o remount,bind,rw '{f.config}'",
        "mount -o remount,bind,rw /usr",
        f"umount '{f.config}'",
        "umount /etc/hosts",
        "mount -t tmpfs none /tmp",
        f"echo x >> '{f.sandbox_toml}'",
        "echo x > /usr/lnk-was-here",
        "echo x > /etc/lnk-was-here",
        f"echo x > '{bwrap.package_dir() / 'planted.py'}'",
        "unshare -U -r true",
        "unshare -m true",
    ):
        p = sh(agent, script)
        assert p.returncode != 0, f"{script} succeeded inside the sandbox"
    assert not Path("/usr/lnk-was-here").exists() and not Path("/etc/lnk-was-here").exists()
    assert not (bwrap.package_dir() / "planted.py").exists()
    assert not f.sandbox_toml.read_text().endswith("x\n")


def test_etc_holds_no_secret_of_the_machine(agent: registry.Agent) -> None:
    for path in ("/etc/shadow", "/etc/gshadow", "/etc/ssh", "/etc/sudoers", "/etc/ssl/private"):
        p = sh(agent, f"test -e '{path}'")
        assert p.returncode == 1, f"{path} is in the sandbox"
    p = sh(agent, "cat /etc/passwd; test -r /etc/ssl/certs/ca-certificates.crt && echo certs")
    assert p.returncode == 0, p.stderr
    users = [line.split(":")[0] for line in p.stdout.splitlines() if ":" in line]
    assert users == ["agent", "nobody"] and p.stdout.rstrip().endswith("certs")
    # a grant can't bring /etc back
    with pytest.raises(Exception, match="system folder"):
        file_grants(agent, ["/etc/shadow"], [])


SYSCALLS = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
params = ctypes.create_string_buffer(120)
# x86_64 numbers: io_uring_setup 425, keyctl 250, bpf 321, perf_event_open 298,
# userfaultfd 323, clone3 435, ptrace 101, setns 308
print(call(425, 4, ctypes.addressof(params)), call(250, 0, 0), call(321, 0, 0, 0),
      call(298, 0, 0, -1, -1, 0), call(323, 0), call(435, 0, 0), call(101, 16, 1),
      call(308, 0, 0))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the syscall numbers are x86_64's")
def test_the_filter_refuses_what_no_harness_needs(agent: registry.Agent) -> None:
    cmd = sandboxed(agent, [sys.executable, "-c", SYSCALLS], bwrap=check_bwrap(), runtime=False)
    p = cmd.run(capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["EPERM"] * 5 + ["ENOSYS", "EPERM", "EPERM"], p.stdout
    # outside, the same machine sets io_uring up: it is the filter that refused it
    out = subprocess.run([sys.executable, "-c", SYSCALLS], capture_output=True, text=True)
    assert out.stdout.split()[0] == "ok", out.stdout


def test_open_files_are_capped_from_the_spec(agent: registry.Agent) -> None:
    spec = grants.Spec(files=256)
    prefix = limits.launch_prefix(limits.Limits.of(spec), None)
    p = sh(agent, "ulimit -n; ulimit -Hn; ulimit -n 1000", prefix=prefix)
    assert p.stdout.split()[:2] == ["256", "256"]
    assert p.returncode != 0  # the hard limit can't be raised from inside


def test_the_runner_puts_the_sandbox_in_the_agent_s_cgroup(start_agent: Any, home: Path) -> None:
    a = registry.create(Machine.current(), "main")
    a.settings.sandbox = True
    a.save()
    assert grants.read_spec(a.folders.sandbox_toml).processes == 0
    text = a.folders.sandbox_toml.read_text() + '\n[limits]\nprocesses = 64\nmemory = "512M"\n'
    a.folders.sandbox_toml.write_text(text)
    caps = limits.Limits.of(grants.read_spec(a.folders.sandbox_toml))
    assert (caps.processes, caps.memory) == (64, 512 << 20)
    held = limits.held_here(a.id, caps)
    r = start_agent(agent=a)
    group = limits.make_cgroup(a.id, caps)
    if "(cgroup)" not in " ".join(held):
        assert group is None and "not held" in held[1]
        return
    assert group is not None
    members: set[int] = set()
    for procs in group.procs:
        members |= {int(x) for x in Path(procs).read_text().split()}
    harness = r.endpoint["harness_pid"]
    assert harness in members and r.proc.pid not in members  # the sandbox, not the runner
    assert (group.dirs[-1] / "pids.max").read_text().strip() == "64"
    r.stop()
    assert not any(d.exists() for d in group.dirs)  # removed at the stop


def test_lnk_s_environment_never_reaches_the_sandbox(
    agent: registry.Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bubblewrap's own init (pid 1 in the sandbox) keeps the environment bubblewrap was
    started with: a key in lnk's environment must not be there to read."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak-me-not")
    p = sh(agent, "cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'")
    assert p.returncode == 0, p.stderr
    assert "sk-leak-me-not" not in p.stdout and "HOME=" in p.stdout
