"""The agent's bridge as its runner keeps it: started once the harness answers, started
again if it dies (with a growing wait), stopped first at the runner's stop, so its
polling and firing end before the harness's last turn and before a move's final phase
reads what it keeps (``python -m lnk.connections.bridge AGENT_ID RUNNER_PID``).

The bridge is started from the runner's main thread: it dies with that thread
(PR_SET_PDEATHSIG), and checks its parent besides.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

STOP_S = 30.0
MODULE = "lnk.connections.bridge"


class BridgeProcess:
    def __init__(self, agent_id: str, home: Path, log: Callable[[str], None]) -> None:
        self.agent_id, self.home, self.log = agent_id, home, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.failures = 0
        self.next_start = 0.0

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, self.agent_id, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            cwd=str(self.home),
        )

    def check(self) -> None:
        """Start it again if it died of something other than its own decision to stop."""
        proc = self.proc
        if proc is None or proc.poll() is None:
            return
        code = proc.returncode
        if code == 0:  # it stopped itself (fenced out): the runner is stale too, or will be
            return
        now = time.monotonic()
        if self.next_start == 0.0:
            self.failures += 1
            wait = min(30.0, 0.5 * 2 ** min(self.failures - 1, 6))
            self.next_start = now + wait
            self.log(f"the bridge exited with code {code}; started again in {wait:.1f} s")
        if now >= self.next_start:
            self.next_start = 0.0
            self.start()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            self.log("the bridge did not stop; killing it")
            proc.kill()
            proc.wait()


def kill_stray(runtime: Path, agent_id: str, timeout: float = STOP_S) -> bool:
    """After its runner is gone: the bridge its pidfile names, if it still runs as this
    agent's bridge, is stopped (SIGTERM, then SIGKILL).  True if one was."""
    try:
        pid = int((runtime / "bridge.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    if MODULE.encode() not in cmdline or agent_id.encode() not in cmdline:
        return False  # a pid used again by something else
    if _runner_of(pid, agent_id):
        return False  # its runner lives (one started by hand, with no pidfile): it stops it
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.02)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    (runtime / "bridge.pid").unlink(missing_ok=True)
    return True


def _runner_of(pid: int, agent_id: str) -> bool:
    """Whether ``pid``'s parent is a live runner of this agent."""
    try:
        ppid = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1]
        cmdline = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return False
    return b"lnk.runtime.runner" in cmdline and agent_id.encode() in cmdline
