"""What goes over a bridge's socket: newline-delimited JSON, one object a line.

Shared by :mod:`lnk.bridges.server` and :mod:`lnk.bridges.client`; the
protocol itself is written down in ``docs/bridges.md``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

MAX_LINE = 64 * 1024
"""The most bytes one line may take, its newline included."""

MAX_NAME = 256
"""The most UTF-8 bytes an agent ID, owner or action may take."""

# Error codes, the one error shape's ``code``.
BAD_REQUEST = "bad-request"
UNKNOWN_AGENT = "unknown-agent"
BAD_PROOF = "bad-proof"
TOO_SLOW = "too-slow"
BUSY = "busy"
REPLACED = "replaced"
UNKNOWN_ACTION = "unknown-action"
FAILED = "failed"

ERROR_CODES = frozenset(
    {BAD_REQUEST, UNKNOWN_AGENT, BAD_PROOF, TOO_SLOW, BUSY, REPLACED, UNKNOWN_ACTION, FAILED}
)


class WireError(Exception):
    """A line that breaks the protocol; ``code`` is what to answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def encode(obj: dict[str, Any]) -> bytes:
    """One line: compact JSON and a newline (JSON escapes any newline inside)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def error_line(code: str, message: str) -> bytes:
    """The one error shape."""
    return encode({"ok": False, "error": {"code": code, "message": message}})


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line (its newline may be there or not) into a JSON object."""
    if len(line) > MAX_LINE:
        raise WireError(BAD_REQUEST, f"a line is over {MAX_LINE} bytes")
    try:
        obj = json.loads(
            line.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except (UnicodeDecodeError, ValueError) as e:
        raise WireError(BAD_REQUEST, f"a line is not a JSON object: {e}") from None
    if not isinstance(obj, dict):
        raise WireError(BAD_REQUEST, "a line is not a JSON object")
    return obj


def name_field(obj: dict[str, Any], key: str) -> str:
    """A required, non-empty, short string field."""
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise WireError(BAD_REQUEST, f"{key!r} must be a non-empty string")
    if len(value.encode("utf-8")) > MAX_NAME:
        raise WireError(BAD_REQUEST, f"{key!r} is over {MAX_NAME} bytes")
    return value


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64field(obj: dict[str, Any], key: str) -> bytes:
    """A required standard-base64 field (padding required, nothing else allowed)."""
    value = obj.get(key)
    if not isinstance(value, str):
        raise WireError(BAD_REQUEST, f"{key!r} must be a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise WireError(BAD_REQUEST, f"{key!r} is not valid base64") from None
