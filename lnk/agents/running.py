"""Whether an agent's runner runs here: what its runtime folder says, read without asking it.

The runner writes ``runner.pid`` as it starts and ``endpoint.json`` once its
harness listens (``lnk.runtime.runner``); this module only reads them, so
every layer that must know whether an agent runs (a receive about to replace
it, a restore) asks here, never the runtime.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lnk.agents.registry import Agent


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object the runner wrote, or None (missing, torn, not an object)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def runner_pid(agent: Agent) -> int | None:
    """The agent's live runner's process ID, or None."""
    try:
        pid = int((agent.runtime / "runner.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def is_running(agent: Agent) -> bool:
    return runner_pid(agent) is not None


def listening(agent: Agent) -> bool:
    """The runner runs and said its harness listens (``endpoint.json``), without asking it."""
    return is_running(agent) and (agent.runtime / "endpoint.json").exists()
