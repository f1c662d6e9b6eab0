"""The one collection interface every store driver implements.

An agent's collections are a conversation's events (a *log*: an append-only,
densely numbered sequence starting at 1) and three *maps* (key -> JSON object):
notes, scheduled jobs and a conversation's narrowed tool list.  A conversation
also has a turn lease (``turn.json`` semantics).  Moves and backups carry
collections through :meth:`Store.export` and :meth:`Store.import_` alone, so a
collection kept as files and one kept in SQLite are the same collection.

See ``docs/collections.md`` for the contract in words.
"""

from __future__ import annotations

import json
import math
import time
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
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
        return cls(obj["holder"], obj["taken_ms"], obj["renewed_ms"], obj["took_over"],
                   obj.get("previous_holder"))


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
    value = json.loads(text)
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


class Store(ABC):
    """A place that keeps collections.  Drivers: ``FileStore``, ``SqliteStore``.

    Thread-safe and safe across processes: two processes may open the same store.
    """

    lapse_ms: int

    def __init__(self, lapse_ms: int = DEFAULT_LAPSE_MS) -> None:
        self.lapse_ms = check_number("lapse_ms", lapse_ms, 1)

    # ---- logs -------------------------------------------------------------
    def append(self, cid: CollectionId, number: int, event: dict[str, Any]) -> bool:
        """Write ``event`` as ``number`` only if it is the next free number.

        Returns False if the number is taken or would leave a gap: the caller
        lost a race and reads again.
        """
        self._log(cid)
        check_number("event number", number, 1)
        return self._append_encoded(cid, number, [encode_value(f"event {number}", event)]) == 1

    def append_many(self, cid: CollectionId, first: int, events: list[dict[str, Any]]) -> int:
        """Append ``events`` as ``first``, ``first+1``, ...; returns how many were written
        (0 if ``first`` is not the next free number)."""
        self._log(cid)
        check_number("event number", first, 1)
        texts = [encode_value(f"event {first + i}", e) for i, e in enumerate(events)]
        return self._append_encoded(cid, first, texts)

    @abstractmethod
    def _append_encoded(self, cid: CollectionId, first: int, texts: list[str]) -> int:
        """Write encoded events from ``first`` on, conditionally; how many were written."""

    @abstractmethod
    def iter_events(self, cid: CollectionId, start: int = 1,
                    stop: int | None = None) -> Iterator[Event]:
        """Events with ``start <= number < stop`` (to the end if stop is None), in order."""

    def read(self, cid: CollectionId, start: int = 1, stop: int | None = None) -> list[Event]:
        return list(self.iter_events(cid, start, stop))

    @abstractmethod
    def last_number(self, cid: CollectionId) -> int:
        """The highest event number (0 if none), without reading the history."""

    # ---- maps -------------------------------------------------------------
    @abstractmethod
    def put(self, cid: CollectionId, key: str, value: dict[str, Any]) -> None: ...

    @abstractmethod
    def get(self, cid: CollectionId, key: str) -> dict[str, Any] | None: ...

    @abstractmethod
    def delete(self, cid: CollectionId, key: str) -> bool: ...

    @abstractmethod
    def items(self, cid: CollectionId) -> Iterator[tuple[str, dict[str, Any]]]:
        """Entries in key order (by code point)."""

    # ---- both -------------------------------------------------------------
    @abstractmethod
    def collections(self) -> list[CollectionId]:
        """Every collection written to (appended, put or imported), sorted."""

    @abstractmethod
    def watermark(self, cid: CollectionId) -> int:
        """Changes whenever the collection changes: a log's last number, a map's
        change counter.  Only comparable within one store."""

    # ---- the turn lease ---------------------------------------------------
    @abstractmethod
    def take_lease(self, cid: CollectionId, holder: str,
                   now_ms: int | None = None) -> Lease | None:
        """Take the turn if free, already ours, or lapsed; None if someone else holds it."""

    @abstractmethod
    def renew_lease(self, cid: CollectionId, holder: str, now_ms: int | None = None) -> bool: ...

    @abstractmethod
    def release_lease(self, cid: CollectionId, holder: str) -> bool: ...

    @abstractmethod
    def read_lease(self, cid: CollectionId) -> Lease | None: ...

    def is_lapsed(self, lease: Lease, now: int | None = None) -> bool:
        """A lease not renewed for ``lapse_ms`` milliseconds (or more) has lapsed."""
        t = now_ms() if now is None else now
        return t - lease.renewed_ms >= self.lapse_ms

    def _decide_take(self, cur: Lease | None, holder: str, now: int) -> Lease | None:
        """The lease to write for a take, or None if refused (drivers call under a lock)."""
        if cur is None:
            return Lease(holder, now, now)
        if self.is_lapsed(cur, now):
            return Lease(holder, now, now, took_over=True, previous_holder=cur.holder)
        if cur.holder == holder:
            return Lease(holder, cur.taken_ms, now, cur.took_over, cur.previous_holder)
        return None

    # ---- export/import (driver hooks) ---------------------------------------
    @abstractmethod
    def _touch(self, cid: CollectionId) -> None:
        """Record that the collection exists (an empty import still creates it)."""

    @abstractmethod
    def _replace_map(self, cid: CollectionId, entries: Iterable[tuple[str, str]]) -> None:
        """Replace a map's entries wholly with (key, encoded value) pairs, atomically
        for other users of the store; ``entries`` may raise midway (then nothing changes)."""

    @abstractmethod
    def drop(self, cid: CollectionId) -> None:
        """Remove the collection wholly (its events or entries, and its lease)."""

    def export(self, cid: CollectionId, since: int = 0) -> Iterator[dict[str, Any]]:
        from lnk.collections.records import export_records

        return export_records(self, cid, since)

    def import_(self, records: Iterable[dict[str, Any]]) -> CollectionId:
        from lnk.collections.records import import_records

        return import_records(self, records)

    # ---- lifetime ---------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - optional for drivers
        """Let go of what the store holds open."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers for drivers ----------------------------------------------
    @staticmethod
    def _log(cid: CollectionId) -> CollectionId:
        if not isinstance(cid, CollectionId):
            raise InvalidInput(f"not a CollectionId: {cid!r}")
        if cid.shape != "log":
            raise InvalidInput(f"{cid.kind} is a map, not a log", hint="use put/get/items")
        return cid

    @staticmethod
    def _map(cid: CollectionId) -> CollectionId:
        if not isinstance(cid, CollectionId):
            raise InvalidInput(f"not a CollectionId: {cid!r}")
        if cid.shape != "map":
            raise InvalidInput(f"{cid.kind} is a log, not a map", hint="use append/read")
        return cid

    @staticmethod
    def _range(start: int, stop: int | None) -> tuple[int, int | None]:
        check_number("start", start, 1)
        if stop is not None:
            check_number("stop", stop, 1)
        return start, stop
