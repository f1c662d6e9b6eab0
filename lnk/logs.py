"""One log format for lnk's daemons (the runner, the harness, the relay, the proxy).

Each line is ``<UTC time, ISO 8601 with ms> <daemon>: <message>``, written to
stdout, which the runner sends to the agent's log (``lnk agent logs``)::

    2026-11-30T22:15:36.712+00:00 lnk runner: the harness exited with code 1

A daemon calls :func:`setup` once at its start and logs through
``logging.getLogger("lnk runner")`` (or :func:`get`).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

FORMAT = "%(asctime)s %(name)s: %(message)s"


class _Formatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")


def setup(level: int = logging.INFO) -> None:
    """Send every ``lnk ...`` logger's lines to stdout, in the one format, unbuffered."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def get(daemon: str) -> logging.Logger:
    """The logger of one daemon: ``get("harness")`` logs as ``lnk harness``."""
    return logging.getLogger(f"lnk {daemon}")
