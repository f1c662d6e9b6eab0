"""One conformance suite, run unchanged against every collection driver.

(Named ``test_collections_conformance.py``, not ``test_conformance.py``: pytest
imports test files by basename and tests/transport/buckets/ already has one.)
"""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk.collections import (
    DRIVERS,
    MAX_VALUE_BYTES,
    CollectionId,
    Event,
    Store,
    copy_collection,
    open_store,
)
from lnk.errors import InvalidInput

LAPSE = 60_000
CONV = CollectionId("events", "link:main")
NOTES = CollectionId("notes", "link:main")
MP = multiprocessing.get_context("spawn")


def _path(driver: str, base: Path) -> Path:
    return base / ("store.db" if driver == "sqlite" else "store")


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_path(driver: str, tmp_path: Path) -> Path:
    return _path(driver, tmp_path)


@pytest.fixture
def store(driver: str, store_path: Path) -> Iterator[Store]:
    s = open_store(driver, store_path)
    yield s
    s.close()


def _other(driver: str, tmp_path: Path, name: str) -> Store:
    return open_store(driver, _path(driver, tmp_path / name))


# ---- logs -----------------------------------------------------------------


def test_append_and_read_ranges(store: Store) -> None:
    assert store.last_number(CONV) == 0
    assert store.read(CONV) == []
    for n in range(1, 11):
        assert store.append(CONV, n, {"n": n, "text": f"message {n}"})
    assert store.last_number(CONV) == 10
    assert [e.number for e in store.read(CONV)] == list(range(1, 11))
    assert store.read(CONV, 4, 7) == [Event(n, {"n": n, "text": f"message {n}"}) for n in (4, 5, 6)]
    assert [e.number for e in store.read(CONV, 9)] == [9, 10]
    assert store.read(CONV, 11) == []
    assert store.read(CONV, 5, 5) == []
    assert [e.number for e in store.iter_events(CONV, 8, 100)] == [8, 9, 10]


def test_conditional_append(store: Store) -> None:
    assert store.append(CONV, 2, {"x": 1}) is False  # a gap: 1 is free
    assert store.append(CONV, 1, {"x": 1}) is True
    assert store.append(CONV, 1, {"x": 2}) is False  # taken
    assert store.append(CONV, 3, {"x": 3}) is False  # a gap
    assert store.read(CONV) == [Event(1, {"x": 1})]
    assert store.append_many(CONV, 2, [{"a": 1}, {"a": 2}]) == 2
    assert store.append_many(CONV, 2, [{"a": 9}]) == 0
    assert store.last_number(CONV) == 3
    assert store.watermark(CONV) == 3


@pytest.mark.parametrize("bad", [0, -1, "1", True, 1.0])
def test_bad_event_numbers_refused(store: Store, bad: Any) -> None:
    with pytest.raises(InvalidInput):
        store.append(CONV, bad, {})


@pytest.mark.parametrize(
    "bad",
    [
        [1],
        "text",
        {"x": float("nan")},
        {1: "int key"},
        {"x": object()},
        {"big": "a" * MAX_VALUE_BYTES},
    ],
)
def test_bad_events_refused(store: Store, bad: Any) -> None:
    with pytest.raises(InvalidInput):
        store.append(CONV, 1, bad)
    assert store.last_number(CONV) == 0


def test_logs_and_maps_are_not_mixed(store: Store) -> None:
    with pytest.raises(InvalidInput):
        store.put(CONV, "k", {})
    with pytest.raises(InvalidInput):
        store.append(NOTES, 1, {})


def test_big_log_last_number(store: Store) -> None:
    assert store.append_many(CONV, 1, [{"i": i} for i in range(1, 1001)]) == 1000
    assert store.last_number(CONV) == 1000
    assert store.append(CONV, 1001, {"i": 1001})
    assert store.last_number(CONV) == 1001
    assert sum(1 for _ in store.iter_events(CONV)) == 1001


# ---- names ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "link:main",
        "a%41",
        "..",
        ".hidden",
        "spaces and ünïcödé ☃",
        "~tilde",
        "x" * 200,
        "é" * 200,
        "telegram:-100123:thread/1".replace("/", "|"),
    ],
)
def test_names_round_trip(store: Store, name: str) -> None:
    cid = CollectionId("events", name)
    notes = CollectionId("notes", name)
    assert store.append(cid, 1, {"n": name})
    store.put(notes, name, {"k": name})
    assert store.read(cid) == [Event(1, {"n": name})]
    assert list(store.items(notes)) == [(name, {"k": name})]
    assert set(store.collections()) == {cid, notes}


@pytest.mark.parametrize("name", ["", "a/b", "nul\x00", "tab\t", "x" * 201, "\ud800", 7])
def test_bad_names_refused(name: Any) -> None:
    with pytest.raises(InvalidInput):
        CollectionId("events", name)


def test_bad_kind_refused() -> None:
    with pytest.raises(InvalidInput):
        CollectionId("secrets", "link:main")


# ---- maps -----------------------------------------------------------------


def test_maps(store: Store) -> None:
    jobs = CollectionId("jobs", "link:main")
    assert store.get(NOTES, "a") is None
    assert list(store.items(NOTES)) == []
    w0 = store.watermark(NOTES)
    store.put(NOTES, "b", {"v": 2})
    store.put(NOTES, "a", {"v": 1})
    store.put(NOTES, "a:1", {"v": 3})
    w1 = store.watermark(NOTES)
    assert w1 != w0
    assert store.get(NOTES, "a") == {"v": 1}
    assert list(store.items(NOTES)) == [("a", {"v": 1}), ("a:1", {"v": 3}), ("b", {"v": 2})]
    store.put(NOTES, "a", {"v": 10})
    assert store.get(NOTES, "a") == {"v": 10}
    assert store.watermark(NOTES) != w1
    assert store.delete(NOTES, "a") is True
    assert store.delete(NOTES, "a") is False
    assert store.get(NOTES, "a") is None
    assert list(store.items(jobs)) == []
    assert store.collections() == [NOTES]
    with pytest.raises(InvalidInput):
        store.put(NOTES, "a/b", {})
    with pytest.raises(InvalidInput):
        store.put(NOTES, "k", {"big": "x" * MAX_VALUE_BYTES})


def test_many_map_entries_in_key_order(store: Store) -> None:
    keys = [f"job-{i:04d}" for i in range(600)]
    for k in reversed(keys):
        store.put(NOTES, k, {"k": k})
    assert [k for k, _ in store.items(NOTES)] == keys


# ---- racing writers -------------------------------------------------------


def _race_numbers(store: Store, who: str, upto: int) -> list[int]:
    """Try every number in order; return those this writer won."""
    won = []
    for n in range(1, upto + 1):
        if store.append(CONV, n, {"w": who, "n": n}):
            won.append(n)
    return won


def _check_race(store: Store, wins: dict[str, list[int]], upto: int) -> None:
    all_won = sorted(n for w in wins.values() for n in w)
    assert all_won == list(range(1, upto + 1))  # every number written exactly once
    events = store.read(CONV)
    assert [e.number for e in events] == list(range(1, upto + 1))
    for who, numbers in wins.items():
        for n in numbers:
            assert events[n - 1].data == {"w": who, "n": n}


def test_racing_threads(store: Store) -> None:
    wins: dict[str, list[int]] = {}
    start = threading.Barrier(6)

    def run(who: str) -> None:
        start.wait()
        wins[who] = _race_numbers(store, who, 150)

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 6
    _check_race(store, wins, 150)


def _proc_race(driver: str, path: str, who: str, upto: int, out: str, start: Any) -> None:
    store = open_store(driver, Path(path))
    start.wait()
    won = _race_numbers(store, who, upto)
    Path(out).write_text(json.dumps(won))
    store.close()


def _proc_writer(driver: str, path: str, who: str, count: int, start: Any) -> None:
    """Append ``count`` events of one's own, reading again after each lost race."""
    store = open_store(driver, Path(path))
    start.wait()
    for k in range(count):
        while not store.append(CONV, store.last_number(CONV) + 1, {"w": who, "k": k}):
            pass
    store.close()


def _run_procs(target: Any, argss: list[tuple[Any, ...]]) -> None:
    start = MP.Event()
    procs = [MP.Process(target=target, args=(*a, start)) for a in argss]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_racing_processes_same_numbers(driver: str, store_path: Path, tmp_path: Path) -> None:
    open_store(driver, store_path).close()
    outs = {f"p{i}": tmp_path / f"p{i}.json" for i in range(4)}
    _run_procs(_proc_race, [(driver, str(store_path), w, 120, str(o)) for w, o in outs.items()])
    wins = {w: json.loads(o.read_text()) for w, o in outs.items()}
    _check_race(open_store(driver, store_path), wins, 120)


def test_racing_processes_no_event_lost(driver: str, store_path: Path) -> None:
    open_store(driver, store_path).close()
    _run_procs(_proc_writer, [(driver, str(store_path), f"p{i}", 40) for i in range(4)])
    events = open_store(driver, store_path).read(CONV)
    assert [e.number for e in events] == list(range(1, 161))
    assert sorted((e.data["w"], e.data["k"]) for e in events) == sorted(
        (f"p{i}", k) for i in range(4) for k in range(40)
    )


# ---- the turn lease -------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "lapsed"), [(LAPSE - 1, False), (LAPSE, True), (LAPSE + 1, True)]
)
def test_lease_lapses_to_the_millisecond(store: Store, after: int, lapsed: bool) -> None:
    t0 = 1_700_000_000_000
    assert store.take_lease(CONV, "proc-a", now_ms=t0) is not None
    assert store.renew_lease(CONV, "proc-a", now_ms=t0 + 10_000)
    held = store.read_lease(CONV)
    assert held is not None and store.is_lapsed(held, t0 + 10_000 + after) is lapsed
    got = store.take_lease(CONV, "proc-b", now_ms=t0 + 10_000 + after)
    lease = store.read_lease(CONV)
    assert lease is not None
    if lapsed:
        assert got is not None and got.holder == "proc-b" and got.took_over
        assert got.previous_holder == "proc-a"
        assert lease == got
        assert not store.renew_lease(CONV, "proc-a", now_ms=t0 + 10_000 + after)
        assert not store.release_lease(CONV, "proc-a")
    else:
        assert got is None
        assert lease.holder == "proc-a" and lease.renewed_ms == t0 + 10_000
        assert lease.taken_ms == t0


def test_lease_take_renew_release(store: Store) -> None:
    assert store.read_lease(CONV) is None
    a = store.take_lease(CONV, "a", now_ms=1000)
    assert a is not None and (a.holder, a.taken_ms, a.renewed_ms, a.took_over) == (
        "a",
        1000,
        1000,
        False,
    )
    again = store.take_lease(CONV, "a", now_ms=5000)  # the holder's own: kept, renewed
    assert again is not None and (again.taken_ms, again.renewed_ms) == (1000, 5000)
    assert store.take_lease(CONV, "b", now_ms=5001) is None
    assert store.renew_lease(CONV, "b", now_ms=5001) is False
    assert store.renew_lease(CONV, "a", now_ms=9000) is True
    assert store.release_lease(CONV, "b") is False
    assert store.release_lease(CONV, "a") is True
    assert store.release_lease(CONV, "a") is False
    assert store.read_lease(CONV) is None
    b = store.take_lease(CONV, "b", now_ms=9001)
    assert b is not None and not b.took_over and b.previous_holder is None
    assert store.collections() == []  # a lease alone is not a collection


def test_lapse_is_the_stores_setting(driver: str, store_path: Path) -> None:
    slow = open_store(driver, store_path, lapse_ms=60_000)
    quick = open_store(driver, store_path, lapse_ms=500)
    assert slow.take_lease(CONV, "a", now_ms=0) is not None
    assert slow.take_lease(CONV, "b", now_ms=500) is None
    got = quick.take_lease(CONV, "b", now_ms=500)
    assert got is not None and got.took_over


def test_one_taker_of_a_lapsed_lease_threads(store: Store) -> None:
    store.take_lease(CONV, "crashed", now_ms=0)
    won: list[str] = []
    start = threading.Barrier(8)

    def run(who: str) -> None:
        start.wait()
        if store.take_lease(CONV, who, now_ms=LAPSE + 5) is not None:
            won.append(who)

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    lease = store.read_lease(CONV)
    assert lease is not None and lease.holder == won[0] and lease.previous_holder == "crashed"


def _proc_take(driver: str, path: str, who: str, out: str, start: Any) -> None:
    store = open_store(driver, Path(path))
    start.wait()
    got = store.take_lease(CONV, who, now_ms=LAPSE + 5)
    Path(out).write_text(json.dumps(got is not None))


def test_one_taker_of_a_lapsed_lease_processes(
    driver: str, store_path: Path, tmp_path: Path
) -> None:
    open_store(driver, store_path).take_lease(CONV, "crashed", now_ms=0)
    outs = {f"p{i}": tmp_path / f"take{i}.json" for i in range(4)}
    _run_procs(_proc_take, [(driver, str(store_path), w, str(o)) for w, o in outs.items()])
    winners = [w for w, o in outs.items() if json.loads(o.read_text())]
    assert len(winners) == 1
    lease = open_store(driver, store_path).read_lease(CONV)
    assert lease is not None and lease.holder == winners[0] and lease.took_over


# ---- export / import ------------------------------------------------------


def _fill(store: Store) -> None:
    store.append_many(CONV, 1, [{"i": i, "text": "ü" * i} for i in range(1, 31)])
    for kind in ("notes", "jobs", "tools"):
        cid = CollectionId(kind, "link:main")
        for i in range(5):
            store.put(cid, f"{kind}-{i}", {"i": i, "nested": {"l": [1, 2.5, None, True]}})


def _dump(store: Store) -> list[list[dict[str, Any]]]:
    return [list(store.export(cid)) for cid in store.collections()]


def test_export_format(store: Store) -> None:
    _fill(store)
    recs = list(store.export(CONV))
    assert recs[0] == {
        "t": "collection",
        "v": 1,
        "kind": "events",
        "name": "link:main",
        "shape": "log",
        "since": 0,
    }
    assert recs[1] == {"t": "event", "n": 1, "data": {"i": 1, "text": "ü"}}
    assert recs[-1] == {"t": "end", "count": 30}
    recs = list(store.export(NOTES))
    assert recs[0]["shape"] == "map" and recs[1]["t"] == "entry" and recs[-1]["count"] == 5
    json.dumps(recs)  # JSON-able


def test_round_trip_across_drivers(store: Store, tmp_path: Path) -> None:
    _fill(store)
    before = _dump(store)
    via = [open_store(d, _path(d, tmp_path / f"via-{d}")) for d in ("files", "sqlite", "files")]
    src = store
    for dst in via:
        for cid in src.collections():
            assert copy_collection(src, dst, cid) == cid
        assert dst.collections() == store.collections()
        assert _dump(dst) == before
        src = dst


def test_export_since_and_continue(store: Store, driver: str, tmp_path: Path) -> None:
    _fill(store)
    dst = _other(driver, tmp_path, "dst")
    copy_collection(store, dst, CONV)  # the bulk phase
    store.append_many(CONV, 31, [{"late": 1}, {"late": 2}])
    recs = list(store.export(CONV, since=30))
    assert [r["n"] for r in recs if r["t"] == "event"] == [31, 32]
    assert dst.import_(recs) == CONV  # the pause phase: only what is new
    assert list(dst.export(CONV)) == list(store.export(CONV))
    assert dst.import_(list(store.export(CONV, since=10))) == CONV  # overlap: identical, fine
    assert dst.last_number(CONV) == 32


def test_import_gap_and_mismatch_refused(store: Store, driver: str, tmp_path: Path) -> None:
    _fill(store)
    dst = _other(driver, tmp_path, "dst")
    with pytest.raises(InvalidInput, match="holds only 0"):
        dst.import_(store.export(CONV, since=5))
    dst.append(CONV, 1, {"i": 1, "text": "different"})
    with pytest.raises(InvalidInput, match="differs"):
        dst.import_(store.export(CONV))
    assert dst.last_number(CONV) == 1


def test_map_import_replaces_wholly(store: Store, driver: str, tmp_path: Path) -> None:
    _fill(store)
    dst = _other(driver, tmp_path, "dst")
    dst.put(NOTES, "stale", {"old": True})
    dst.put(NOTES, "notes-0", {"old": True})
    w = dst.watermark(NOTES)
    copy_collection(store, dst, NOTES)
    assert list(dst.items(NOTES)) == list(store.items(NOTES))
    assert dst.watermark(NOTES) != w
    empty = CollectionId("tools", "empty")
    dst.import_(
        [
            {"t": "collection", "v": 1, "kind": "tools", "name": "empty", "shape": "map"},
            {"t": "end", "count": 0},
        ]
    )
    assert empty in dst.collections() and list(dst.items(empty)) == []


def _log_stream(n: int = 3) -> list[dict[str, Any]]:
    return (
        [
            {
                "t": "collection",
                "v": 1,
                "kind": "events",
                "name": "link:main",
                "shape": "log",
                "since": 0,
            }
        ]
        + [{"t": "event", "n": i, "data": {"i": i}} for i in range(1, n + 1)]
        + [{"t": "end", "count": n}]
    )


def _map_stream() -> list[dict[str, Any]]:
    return [
        {"t": "collection", "v": 1, "kind": "notes", "name": "link:main", "shape": "map"},
        {"t": "entry", "key": "a", "value": {"v": 1}},
        {"t": "entry", "key": "b", "value": {"v": 2}},
        {"t": "end", "count": 2},
    ]


def _set(recs: list[dict[str, Any]], i: int, **kw: Any) -> list[dict[str, Any]]:
    recs[i] = {**recs[i], **kw}
    return recs


HOSTILE: dict[str, list[Any]] = {
    "empty": [],
    "no header": _log_stream()[1:],
    "unknown kind": _set(_log_stream(), 0, kind="secrets"),
    "kind/shape mismatch": _set(_log_stream(), 0, kind="notes"),
    "version": _set(_log_stream(), 0, v=2),
    "version bool": _set(_log_stream(), 0, v=True),
    "bad name slash": _set(_log_stream(), 0, name="../../etc"),
    "bad name empty": _set(_log_stream(), 0, name=""),
    "bad name long": _set(_log_stream(), 0, name="x" * 201),
    "bad name nul": _set(_log_stream(), 0, name="a\x00b"),
    "name not str": _set(_log_stream(), 0, name=["a"]),
    "since negative": _set(_log_stream(), 0, since=-1),
    "since str": _set(_log_stream(), 0, since="0"),
    "extra header field": _set(_log_stream(), 0, extra=1),
    "gap": _log_stream()[:2] + _log_stream()[3:],
    "repeat": _log_stream()[:2] + _log_stream()[1:],
    "number str": _set(_log_stream(), 1, n="1"),
    "number bool": _set(_log_stream(), 1, n=True),
    "data list": _set(_log_stream(), 2, data=[1]),
    "data nan": _set(_log_stream(), 2, data={"x": float("inf")}),
    "oversized event": _set(_log_stream(), 2, data={"x": "a" * MAX_VALUE_BYTES}),
    "extra event field": _set(_log_stream(), 2, extra=1),
    "entry in log": _set(_log_stream(), 2, t="entry"),
    "record not a dict": [*_log_stream()[:2], "event", *_log_stream()[3:]],
    "no end": _log_stream()[:-1],
    "wrong count": _set(_log_stream(), -1, count=7),
    "after end": [*_log_stream(), {"t": "event", "n": 4, "data": {}}],
    "map key slash": _set(_map_stream(), 1, key="a/b"),
    "map key int": _set(_map_stream(), 1, key=1),
    "map duplicate key": _set(_map_stream(), 2, key="a"),
    "map value str": _set(_map_stream(), 1, value="v"),
    "map oversized": _set(_map_stream(), 1, value={"x": "a" * MAX_VALUE_BYTES}),
    "map no end": _map_stream()[:-1],
    "map wrong count": _set(_map_stream(), -1, count=1),
    "map event record": _set(_map_stream(), 1, t="event"),
    "map since": _set(_map_stream(), 0, since=0),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_import_refused(store: Store, case: str) -> None:
    store.put(NOTES, "kept", {"v": 0})
    before = _dump(store)
    with pytest.raises(InvalidInput):
        store.import_(HOSTILE[case])
    assert _dump(store) == before  # nothing changed


def test_valid_streams_accepted(store: Store) -> None:
    assert store.import_(_log_stream()) == CONV
    assert store.import_(_map_stream()) == NOTES
    assert store.last_number(CONV) == 3
    assert dict(store.items(NOTES)) == {"a": {"v": 1}, "b": {"v": 2}}
