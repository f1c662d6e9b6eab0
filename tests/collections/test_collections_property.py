"""Random operation sequences give the same observable state on every driver."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lnk.collections import DRIVERS, CollectionId, Lease, Store, open_store
from lnk.errors import InvalidInput

LAPSE = 1000
CONVS = [CollectionId("events", "link:main"), CollectionId("events", "ü:1")]
MAPS = [CollectionId(k, "link:main") for k in ("notes", "jobs", "tools")] + [
    CollectionId("notes", "other%20")
]
KEYS = ["a", "b", "a:b", "~x", "é"]
HOLDERS = ["h1", "h2", "h3"]

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_obj = st.dictionaries(
    st.text(max_size=5),
    st.recursive(
        json_leaf,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
        max_leaves=6,
    ),
    max_size=4,
)

ops = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(CONVS), st.integers(0, 7), json_obj),
    st.tuples(
        st.just("append_many"),
        st.sampled_from(CONVS),
        st.integers(1, 7),
        st.lists(json_obj, max_size=3),
    ),
    st.tuples(st.just("put"), st.sampled_from(MAPS), st.sampled_from(KEYS), json_obj),
    st.tuples(st.just("delete"), st.sampled_from(MAPS), st.sampled_from(KEYS)),
    st.tuples(
        st.just("take"),
        st.sampled_from(CONVS),
        st.sampled_from(HOLDERS),
        st.sampled_from([0, 1, LAPSE - 1, LAPSE]),
    ),
    st.tuples(
        st.just("renew"),
        st.sampled_from(CONVS),
        st.sampled_from(HOLDERS),
        st.sampled_from([0, 1, LAPSE - 1, LAPSE]),
    ),
    st.tuples(st.just("release"), st.sampled_from(CONVS), st.sampled_from(HOLDERS)),
    st.tuples(
        st.just("import_map"),
        st.sampled_from(MAPS),
        st.dictionaries(st.sampled_from(KEYS), json_obj, max_size=3),
    ),
    st.tuples(
        st.just("import_log"),
        st.sampled_from(CONVS),
        st.integers(0, 4),
        st.lists(json_obj, max_size=3),
    ),
)


def _lease(lease: Lease | None) -> Any:
    return None if lease is None else lease.to_json()


def _apply(store: Store, op: tuple[Any, ...], clock: list[int]) -> Any:
    name, cid = op[0], op[1]
    try:
        if name == "append":
            return store.append(cid, op[2], op[3])
        if name == "append_many":
            return store.append_many(cid, op[2], op[3])
        if name == "put":
            return store.put(cid, op[2], op[3])
        if name == "delete":
            return store.delete(cid, op[2])
        if name in ("take", "renew"):
            clock[0] += op[3]
            if name == "take":
                return _lease(store.take_lease(cid, op[2], now_ms=clock[0]))
            return store.renew_lease(cid, op[2], now_ms=clock[0])
        if name == "release":
            return store.release_lease(cid, op[2])
        if name == "import_map":
            recs = [{"t": "collection", "v": 1, "kind": cid.kind, "name": cid.name, "shape": "map"}]
            recs += [{"t": "entry", "key": k, "value": v} for k, v in op[2].items()]
            return store.import_([*recs, {"t": "end", "count": len(op[2])}])
        since, events = op[2], op[3]
        recs = [
            {
                "t": "collection",
                "v": 1,
                "kind": "events",
                "name": cid.name,
                "shape": "log",
                "since": since,
            }
        ]
        recs += [{"t": "event", "n": since + i + 1, "data": e} for i, e in enumerate(events)]
        return store.import_([*recs, {"t": "end", "count": len(events)}])
    except InvalidInput as e:
        return ("refused", type(e).__name__)


def _state(store: Store, clock: int) -> Any:
    return {
        "collections": store.collections(),
        "exports": [list(store.export(c)) for c in store.collections()],
        "gets": [store.get(m, k) for m in MAPS for k in KEYS],
        "last": [store.last_number(c) for c in CONVS],
        "leases": [_lease(store.read_lease(c)) for c in CONVS],
        "lapsed": [
            store.is_lapsed(le, clock) if (le := store.read_lease(c)) else None for c in CONVS
        ],
        "watermarks": [store.watermark(c) for c in CONVS + MAPS],
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, max_size=25))
def test_drivers_agree(sequence: list[tuple[Any, ...]]) -> None:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for driver in DRIVERS:
            path = Path(tmp) / (driver + (".db" if driver == "sqlite" else ""))
            store = open_store(driver, path, lapse_ms=LAPSE)
            clock = [1_000_000]
            outcomes = [_apply(store, op, clock) for op in sequence]
            results.append((outcomes, _state(store, clock[0])))
            store.close()
    assert results[0] == results[1]
