"""Export and import: a collection as an ordered stream of JSON-able records.

    {"t": "collection", "v": 1, "kind": "events", "name": "link:main", "shape": "log", "since": 0}
    {"t": "event", "n": 1, "data": {...}}          one per event with number > since
    {"t": "end", "count": 1}

    {"t": "collection", "v": 1, "kind": "notes", "name": "link:main", "shape": "map"}
    {"t": "entry", "key": "k", "value": {...}}     one per entry, in key order
    {"t": "end", "count": 1}

Records may come from a hostile stream, so import checks every field strictly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from lnk.collections.ids import (
    FORMAT_VERSION,
    KINDS,
    CollectionId,
    check_name,
    check_number,
    decode_value,
    encode_value,
)
from lnk.errors import InvalidInput

if TYPE_CHECKING:
    from lnk.collections.base import Store

BATCH_EVENTS = 256
BATCH_BYTES = 4 << 20


def export_records(store: Store, cid: CollectionId, since: int = 0) -> Iterator[dict[str, Any]]:
    """Records for one collection; for a log, only events numbered above ``since``."""
    if cid.shape == "log":
        check_number("since", since, 0)
        last = store.last_number(
            cid
        )  # a snapshot: events appended meanwhile wait for the next pass
        yield {
            "t": "collection",
            "v": FORMAT_VERSION,
            "kind": cid.kind,
            "name": cid.name,
            "shape": "log",
            "since": since,
        }
        count = 0
        if last > since:
            for ev in store.iter_events(cid, since + 1, last + 1):
                yield {"t": "event", "n": ev.number, "data": ev.data}
                count += 1
        yield {"t": "end", "count": count}
        return
    if since:
        raise InvalidInput(f"since= is for logs; {cid.kind} is a map", hint="export it whole")
    yield {
        "t": "collection",
        "v": FORMAT_VERSION,
        "kind": cid.kind,
        "name": cid.name,
        "shape": "map",
    }
    count = 0
    for key, value in store.items(cid):
        yield {"t": "entry", "key": key, "value": value}
        count += 1
    yield {"t": "end", "count": count}


def _canon(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def _fields(rec: object, want: set[str], what: str) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise InvalidInput(f"{what} is a {type(rec).__name__}, not a JSON object")
    keys = set(rec)
    if keys != want:
        extra, missing = sorted(map(str, keys - want)), sorted(want - keys)
        raise InvalidInput(
            f"{what} has unexpected fields {extra} or lacks {missing}",
            hint="the stream was made by another version of lnk or was tampered with",
        )
    return rec


def _parse_header(rec: object) -> tuple[CollectionId, int]:
    if not isinstance(rec, dict) or rec.get("t") != "collection":
        raise InvalidInput("a collection stream does not start with its collection record")
    shape = rec.get("shape")
    want = {"t", "v", "kind", "name", "shape"} | ({"since"} if shape == "log" else set())
    _fields(rec, want, "the collection record")
    if rec["v"] != FORMAT_VERSION or isinstance(rec["v"], bool):
        raise InvalidInput(
            f"collection record version {rec['v']!r} (this lnk reads {FORMAT_VERSION})"
        )
    kind = rec["kind"]
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidInput(f"unknown collection kind {kind!r}", hint=f"known: {', '.join(KINDS)}")
    if KINDS[kind] != shape:
        raise InvalidInput(f"collection kind {kind} is a {KINDS[kind]}, the stream says {shape!r}")
    cid = CollectionId(kind, check_name("collection name", rec["name"]))
    since = check_number("since", rec["since"], 0) if shape == "log" else 0
    return cid, since


def _parse_end(rec: dict[str, Any], seen: int) -> None:
    _fields(rec, {"t", "count"}, "the end record")
    if check_number("count", rec["count"], 0) != seen:
        raise InvalidInput(f"the end record counts {rec['count']} records, the stream held {seen}")


def import_records(store: Store, records: Iterable[dict[str, Any]]) -> CollectionId:
    it = iter(records)
    try:
        first = next(it)
    except StopIteration:
        raise InvalidInput("an empty collection stream") from None
    cid, since = _parse_header(first)
    if cid.shape == "log":
        _import_log(store, cid, since, it)
    else:
        store._replace_map(cid, _map_entries(it))
    return cid


def _no_more(it: Iterator[Any]) -> None:
    """The stream must end with its end record (checked before anything is applied)."""
    for extra in it:
        raise InvalidInput(f"a record after the end record: {str(extra)[:80]!r}")


def _map_entries(it: Iterator[Any]) -> Iterator[tuple[str, str]]:
    seen: set[str] = set()
    for rec in it:
        t = rec.get("t") if isinstance(rec, dict) else None
        if t == "end":
            _parse_end(rec, len(seen))
            _no_more(it)
            return
        if t != "entry":
            raise InvalidInput(f"a map stream holds a record of type {t!r}")
        _fields(rec, {"t", "key", "value"}, "an entry record")
        key = check_name("map key", rec["key"])
        if key in seen:
            raise InvalidInput(f"map key {key!r} appears twice in the stream")
        seen.add(key)
        yield key, encode_value(f"the value of {key!r}", rec["value"])
    raise InvalidInput("the collection stream ended without its end record (truncated?)")


def _import_log(store: Store, cid: CollectionId, since: int, it: Iterator[Any]) -> None:
    have = store.last_number(cid)
    if since > have:
        raise InvalidInput(
            f"the stream for {cid.name} continues after event {since}, "
            f"but this store holds only {have} events",
            hint="send the collection from the start (since=0)",
        )
    existing = store.iter_events(cid, since + 1, have + 1) if have > since else iter(())
    expected = since + 1
    batch: list[dict[str, Any]] = []
    batch_first, batch_bytes, seen = have + 1, 0, 0

    def flush() -> None:
        nonlocal batch, batch_first, batch_bytes
        if not batch:
            return
        wrote = store.append_many(cid, batch_first, batch)
        if wrote != len(batch):
            raise InvalidInput(
                f"event {batch_first + wrote} of {cid.name} was written by someone else "
                "during the import",
                hint="pause the agent before importing its conversations",
            )
        batch_first += len(batch)
        batch, batch_bytes = [], 0

    for rec in it:
        t = rec.get("t") if isinstance(rec, dict) else None
        if t == "end":
            _parse_end(rec, seen)
            _no_more(it)
            flush()
            store._touch(cid)
            return
        if t != "event":
            raise InvalidInput(f"a log stream holds a record of type {t!r}")
        _fields(rec, {"t", "n", "data"}, "an event record")
        n = check_number("event number", rec["n"], 1)
        if n != expected:
            raise InvalidInput(
                f"event {n} of {cid.name} where {expected} was due (a gap or a repeat)"
            )
        text = encode_value(f"event {n}", rec["data"])
        seen += 1
        expected += 1
        if n <= have:
            mine = next(existing)
            if mine.number != n or _canon(mine.data) != _canon(rec["data"]):
                raise InvalidInput(
                    f"event {n} of {cid.name} differs from the one this store holds",
                    hint="the two histories diverged; keep one and import into an empty store",
                )
            continue
        batch.append(decode_value(text))
        batch_bytes += len(text)
        if len(batch) >= BATCH_EVENTS or batch_bytes >= BATCH_BYTES:
            flush()
    raise InvalidInput("the collection stream ended without its end record (truncated?)")
