"""What the agent's proxy tells: a line in the agent's log for each connection,
and the last refusal, kept in ``<runtime>/proxy-refused.json`` for
``lnk agent status`` (read back by :func:`last_refusal`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

from lnk.agents.grants import norm_host

REFUSED = "proxy-refused.json"

_log_lock = threading.Lock()


def print_log(msg: str) -> None:
    """One line of the agent's log (the runner's standard output), time-stamped."""
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
    with _log_lock:
        sys.stdout.write(f"{stamp} {msg}\n")
        sys.stdout.flush()


def size_text(n: int) -> str:
    return (
        f"{n} B"
        if n < 1024
        else f"{n / 1024:.1f} KiB"
        if n < 1 << 20
        else f"{n / (1 << 20):.1f} MiB"
    )


def refusal(host: str, port: int, why: str) -> dict[str, object]:
    """The record of one refused connection, as it is kept."""
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": norm_host(host),
        "port": port,
        "why": why,
    }


def keep_refusal(runtime: Path, record: dict[str, object]) -> None:
    """Keep ``record`` as the last refusal (replaced whole; a failure is no refusal's)."""
    with contextlib.suppress(OSError):
        tmp = runtime / f".{REFUSED}.tmp"
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, runtime / REFUSED)


def last_refusal(runtime: Path) -> dict[str, object] | None:
    """The last connection the agent's proxy refused, if any."""
    try:
        data = json.loads((runtime / REFUSED).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
