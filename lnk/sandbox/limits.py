"""What the sandbox may use: memory, processes and open files.

The agent's ``[limits]`` (``Config/sandbox.toml``) says how much; this module
says how each is held here:

* open files: ``RLIMIT_NOFILE``, soft and hard, set by ``prlimit`` as bubblewrap
  starts (the sandbox has no capability to raise it back);
* memory and processes: a cgroup of the agent's own (``lnk-<id>``) under the
  one lnk runs in, where this machine lets lnk make one (cgroup v1's memory and
  pids hierarchies, writable by root; or cgroup v2 where lnk's own cgroup
  already hands those controllers down).  The sandbox joins it before bubblewrap
  runs (a shell line writes its own process ID, then becomes bubblewrap), so
  the harness and everything it starts count, and lnk's proxy and runner
  don't.  A service under systemd gets them as the unit's ``MemoryMax`` and
  ``TasksMax`` instead.

``RLIMIT_NPROC`` is not used: it counts every process of the user, inside the
sandbox or not, and root is exempt from it.  Where no cgroup can be made,
memory and processes are not held, and :func:`held_here` says so (``lnk agent
show --permissions``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from lnk.agents.grants import Spec, parse_size

DEFAULT_PROCESSES = 1024
DEFAULT_FILES = 4096
CGROUP_ROOT = Path("/sys/fs/cgroup")


def machine_memory() -> int:
    """This machine's memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Limits:
    memory: int  # bytes
    processes: int
    files: int

    @classmethod
    def of(cls, spec: Spec) -> Limits:
        """The spec's ``[limits]``; a value it leaves out is this machine's default
        (half its memory, 1,024 processes, 4,096 open files)."""
        return cls(
            memory=parse_size(spec.memory) if spec.memory else machine_memory() // 2,
            processes=spec.processes or DEFAULT_PROCESSES,
            files=spec.files or DEFAULT_FILES,
        )


@dataclass(frozen=True)
class Cgroup:
    """The agent's cgroup: the ``cgroup.procs`` files a process joins it by."""

    dirs: tuple[Path, ...]

    @property
    def procs(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def remove(self) -> None:
        """Remove the cgroup once nothing is in it (a busy one stays for the next start)."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                d.rmdir()


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: {"memory": "/a/b", "": "/x" (v2), ...}."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
        return True
    except OSError:
        return False


Plan = tuple[tuple[Path, ...], tuple[tuple[Path, str], ...]]


def _plan(agent_id: str, limits: Limits) -> Plan | None:
    """The agent's cgroup folders and the caps to write in them, or None (no cgroup here)."""
    own = _own_cgroups()
    name = f"lnk-{agent_id}"
    v1 = [CGROUP_ROOT / c for c in ("memory", "pids")]
    if all((d / "cgroup.procs").exists() for d in v1) and "memory" in own and "pids" in own:
        dirs = (v1[0] / own["memory"].lstrip("/") / name, v1[1] / own["pids"].lstrip("/") / name)
        return dirs, (
            (dirs[0] / "memory.limit_in_bytes", str(limits.memory)),
            (dirs[1] / "pids.max", str(limits.processes)),
        )
    base = CGROUP_ROOT / own.get("", "/").lstrip("/")
    try:
        enabled = (base / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    if not {"memory", "pids"} <= set(enabled):
        return None
    one = base / name
    return (one,), (
        (one / "memory.max", str(limits.memory)),
        (one / "pids.max", str(limits.processes)),
    )


def make_cgroup(agent_id: str, limits: Limits) -> Cgroup | None:
    """The agent's cgroup with its memory and process caps, or None where none can be made."""
    plan = _plan(agent_id, limits)
    if plan is None:
        return None
    dirs, files = plan
    try:
        for d in dirs:
            d.mkdir(exist_ok=True)
    except OSError:
        return None
    group = Cgroup(dirs)
    if not all(_write(path, value) for path, value in files):
        group.remove()
        return None
    return group


def launch_prefix(limits: Limits, group: Cgroup | None) -> list[str]:
    """What goes before bubblewrap's argv: join the cgroup, then cap open files."""
    cap = ["prlimit", f"--nofile={limits.files}:{limits.files}", "--"]
    if group is None:
        return cap
    joins = " && ".join(f"echo $$ > {shlex.quote(p)}" for p in group.procs)
    return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *cap]


def systemd_properties(limits: Limits) -> list[str]:
    """The unit's lines that hold memory and processes under systemd."""
    return [f"MemoryMax={limits.memory}", f"TasksMax={limits.processes}"]


def held_here(agent_id: str, limits: Limits) -> list[str]:
    """Which caps this machine holds, in words (for show --permissions)."""
    out = [f"open files {limits.files}"]
    plan = _plan(agent_id, limits)
    if plan is None or not all(os.access(d.parent, os.W_OK) for d in plan[0]):
        out.append("memory and processes not held: lnk can make no cgroup here")
    else:
        out.append(f"memory {limits.memory >> 20} MiB, processes {limits.processes} (cgroup)")
    return out
