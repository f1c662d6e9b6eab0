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

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import Any

from lnk.collections.ids import (
    DEFAULT_LAPSE_MS,
    FORMAT_VERSION,
    KINDS,
    MAX_JSON_DEPTH,
    MAX_NAME_CHARS,
    MAX_VALUE_BYTES,
    CollectionId,
    Event,
    Lease,
    check_name,
    check_number,
    decode_value,
    encode_value,
    now_ms,
    resolve_now,
)
from lnk.collections.records import export_records, import_records
from lnk.errors import InvalidInput

# the interface's names, so drivers and callers import them from here
__all__ = [
    "DEFAULT_LAPSE_MS",
    "FORMAT_VERSION",
    "KINDS",
    "MAX_JSON_DEPTH",
    "MAX_NAME_CHARS",
    "MAX_VALUE_BYTES",
    "CollectionId",
    "Event",
    "Lease",
    "Store",
    "check_name",
    "check_number",
    "decode_value",
    "encode_value",
    "now_ms",
    "resolve_now",
]


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
    def iter_events(
        self, cid: CollectionId, start: int = 1, stop: int | None = None
    ) -> Iterator[Event]:
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
    def take_lease(self, cid: CollectionId, holder: str, now_ms: int | None = None) -> Lease | None:
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
        return export_records(self, cid, since)

    def import_(self, records: Iterable[dict[str, Any]]) -> CollectionId:
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
