"""Whether a process still runs, for tests that wait for one to end."""

from __future__ import annotations

import time
from pathlib import Path


def process_runs(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie.  A process reaped between two
    looks at /proc is gone, not an error."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` no longer runs, False if it still does after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_runs(pid):
            return True
        time.sleep(0.05)
    return False
