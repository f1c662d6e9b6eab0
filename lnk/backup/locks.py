"""Who holds a ``locks/<run>`` object, and whether that process is gone.

A backup in progress puts ``locks/<run>``: ``{"run", "started", "host", "boot",
"pid", "pstart"}``.  A prune that finds a lock written on its own host (same host
name) whose process is gone (another boot, no such pid, or a pid reused by a
later process) clears it at once; any other lock holds packs back until it is an
hour old (the writer refreshes it every 10 minutes).
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from typing import Any


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" where unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    # the command name (field 2) may hold spaces: count fields after its ")"
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def lock_doc(run: str) -> dict[str, Any]:
    pid = os.getpid()
    return {
        "run": run,
        "started": datetime.now(UTC).isoformat(),
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": pid,
        "pstart": _start_ticks(pid),
    }


def holder_gone(doc: dict[str, Any]) -> bool:
    """True when ``doc`` names a process on this host that no longer runs.  A lock
    from another host, or one without a pid (older lnk), is never judged gone."""
    if doc.get("host") != socket.gethostname():
        return False
    pid = doc.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    boot = _boot_id()
    if doc.get("boot") and boot and doc["boot"] != boot:
        return True  # the machine restarted since
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    start = doc.get("pstart")
    return bool(start) and _start_ticks(pid) not in ("", start)
