"""The collections' names, values and limits: what the store and its records share."""

from __future__ import annotations

import json
import math
import time
import unicodedata
from dataclasses import dataclass
from typing import Any, Literal

from lnk.errors import InvalidInput

KINDS: dict[str, Literal["log", "map"]] = {
    "events": "log",
    "notes": "map",
    "jobs": "map",
    "tools": "map",
}
MAX_NAME_CHARS = 200
MAX_VALUE_BYTES = 1 << 20  # one event or one map value, as JSON
MAX_JSON_DEPTH = 64
DEFAULT_LAPSE_MS = 60_000
FORMAT_VERSION = 1


def check_name(what: str, value: object) -> str:
    """A collection name, map key or lease holder: validated or InvalidInput."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidInput(f"{what} is empty", hint="give a non-empty name")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidInput(
            f"{what} is {len(value)} characters long (at most {MAX_NAME_CHARS})",
            hint="use a shorter name",
        )
    if "/" in value:
        raise InvalidInput(f"{what} {value!r} contains '/'", hint="names may not contain '/'")
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise InvalidInput(
                f"{what} {value!r} contains a control character or a lone surrogate",
                hint="use printable characters only",
            )
    return value


@dataclass(frozen=True, order=True)
class CollectionId:
    """Which collection: a kind (events, notes, jobs, tools) and a name (``link:main``)."""

    kind: str
    name: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidInput(
                f"unknown collection kind {self.kind!r}",
                hint=f"use one of {', '.join(KINDS)}",
            )
        check_name("collection name", self.name)

    @property
    def shape(self) -> Literal["log", "map"]:
        return KINDS[self.kind]


@dataclass(frozen=True)
class Event:
    """One event of a log: its number (1, 2, ...) and its JSON object."""

    number: int
    data: dict[str, Any]


@dataclass(frozen=True)
class Lease:
    """Who runs a conversation's turn.

    ``took_over`` is true when the lease was taken from a holder whose lease had
    lapsed (``previous_holder`` names it): the taker finishes that crashed turn.
    """

    holder: str
    taken_ms: int
    renewed_ms: int
    took_over: bool = False
    previous_holder: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "taken_ms": self.taken_ms,
            "renewed_ms": self.renewed_ms,
            "took_over": self.took_over,
            "previous_holder": self.previous_holder,
        }

    @classmethod
    def from_json(cls, obj: Any) -> Lease:
        ok = (
            isinstance(obj, dict)
            and isinstance(obj.get("holder"), str)
            and _is_int(obj.get("taken_ms"))
            and _is_int(obj.get("renewed_ms"))
            and isinstance(obj.get("took_over"), bool)
            and (obj.get("previous_holder") is None or isinstance(obj["previous_holder"], str))
        )
        if not ok:
            raise InvalidInput("a turn lease record is malformed", hint="release the lease")
        return cls(
            obj["holder"],
            obj["taken_ms"],
            obj["renewed_ms"],
            obj["took_over"],
            obj.get("previous_holder"),
        )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def resolve_now(given: int | None) -> int:
    """``given`` (tests inject time) or the wall clock, in milliseconds."""
    return now_ms() if given is None else check_number("now_ms", given, 0)


def _check_json(value: object, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise InvalidInput(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput("JSON holds a number that is not finite (NaN or infinity)")
        return
    if isinstance(value, list):
        for v in value:
            _check_json(v, depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidInput(f"JSON object key {k!r} is not a string")
            _check_json(v, depth + 1)
        return
    raise InvalidInput(f"a {type(value).__name__} is not JSON")


def encode_value(what: str, value: object) -> str:
    """Validate a JSON object (an event or a map value) and encode it canonically."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object, not {type(value).__name__}")
    _check_json(value, 0)
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_VALUE_BYTES:
        raise InvalidInput(
            f"{what} is {len(text)} bytes of JSON (at most {MAX_VALUE_BYTES})",
            hint="keep large payloads in files and refer to them",
        )
    return text


def decode_value(text: str | bytes) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:  # not JSON, or (bytes) not UTF-8: a file or row lnk did not write
        raise InvalidInput(f"a stored value is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise InvalidInput("a stored value is not a JSON object")
    return value


def check_number(what: str, value: object, minimum: int) -> int:
    if not _is_int(value):
        raise InvalidInput(f"{what} must be an integer, not {type(value).__name__}")
    assert isinstance(value, int)
    if value < minimum:
        raise InvalidInput(f"{what} is {value} (at least {minimum})")
    return value
