"""The box protocol's errors (docs/boxes.md): one JSON line a box writes, read here.

A mover runs every lnk command at a box as ``lnk --errors json ARGS``; a command
that fails writes ``{"error": {"exit", "class", "message", "hint"}}`` as its last
line on stderr, and :func:`remote_error` makes the same error here.
"""

from __future__ import annotations

import json
from typing import Any

from lnk import errors as _errors
from lnk.errors import EXIT_CODES, LnkError
from lnk.text import one_line

PROTOCOL_ARGS = ("--errors", "json")
"""What every lnk command a leg runs is given: errors come back as one JSON line."""


def _error_class(name: object, code: int) -> type[LnkError]:
    """The class named in a box's error line, if it is one of ours; else by exit code."""
    cls = getattr(_errors, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, LnkError) and cls is not _errors.Interrupted:
        return cls
    for cname, value in EXIT_CODES.items():
        if value == code and cname != "Interrupted":
            found = getattr(_errors, cname)
            if isinstance(found, type) and issubclass(found, LnkError):
                return found
    return LnkError


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def error_line(stderr: str) -> dict[str, Any] | None:
    """The box protocol's error: the last stderr line that is ``{"error": {...}}``."""
    for line in reversed(stderr.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err
    return None


MAX_MESSAGE = 1000
MAX_HINT = 500


def remote_error(where: str, code: int, stderr: str) -> LnkError:
    """An lnk error raised over there becomes the same error here.

    The command ran with ``--errors json`` (docs/boxes.md), so its error is one
    JSON line; anything else (a crash, a killed process) is told by exit code
    and the last line it wrote.
    """
    doc = error_line(stderr)
    if doc is None:
        last = one_line(last_line(stderr), MAX_MESSAGE) or "no message"
        err = _error_class(None, code)(f"on {where}: command failed with exit code {code}: {last}")
    else:
        hint = one_line(doc["hint"], MAX_HINT) if isinstance(doc.get("hint"), str) else None
        message = one_line(doc["message"], MAX_MESSAGE)
        err = _error_class(doc.get("class"), code)(f"on {where}: {message}", hint=hint)
    if code != err.exit_code and type(err) is LnkError:
        err.exit_code = code
    return err
