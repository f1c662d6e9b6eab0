"""One log format for lnk's daemons (the runner, the harness, the relay, the proxy).

Each line is ``<UTC time, ISO 8601 with ms> <daemon>: <message>``, written to
stdout, which the runner sends to the agent's log (``lnk agent logs``)::

    2026-11-30T22:15:36.712+00:00 lnk runner: the harness exited with code 1

A daemon calls :func:`setup` once at its start and logs through
``logging.getLogger("lnk runner")`` (or :func:`get`).
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

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


MAX_LINE = 4096


def tail_lines(path: Path, n: int, max_line: int = MAX_LINE) -> list[str]:
    """The last ``n`` lines of a log, read from its end (never the whole file), each cut at
    ``max_line`` bytes.  Lines end at LF alone: a CR in a line stays in it, for the
    printer to escape, so no line can overwrite another."""
    if n <= 0:
        return []
    budget = n * (max_line + 1) + 1
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        start = max(0, size - budget)
        f.seek(start)
        data = f.read(size - start)
    parts = data.split(b"\n")
    if start > 0:
        parts = parts[1:]  # the first is a piece of a longer line
    if parts and parts[-1] == b"":
        parts.pop()
    out: list[str] = []
    for raw in parts[-n:]:
        text = raw[:max_line].decode("utf-8", "replace")
        out.append(
            text + (f" ... ({len(raw) - max_line} bytes more)" if len(raw) > max_line else "")
        )
    return out
