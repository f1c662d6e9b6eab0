"""Append and read rates of each collection driver.

    python bench/bench_collections.py [--events 20000] [--dir /tmp/x]

Prints a table; tests never time anything, this does.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from lnk.collections import CollectionId, FileStore, SqliteStore, Store

CONV = CollectionId("events", "link:main")


def _event(i: int) -> dict[str, object]:
    return {"type": "message", "from": "owner", "text": f"message number {i} " * 8, "at": i}


def bench(store: Store, events: int) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    for i in range(1, events + 1):  # one conditional append a call, as a turn makes them
        if not store.append(CONV, i, _event(i)):
            raise SystemExit(f"append {i} refused")
    t1 = time.perf_counter()
    n = sum(1 for _ in store.iter_events(CONV))
    t2 = time.perf_counter()
    assert n == events
    store.last_number(CONV)
    t3 = time.perf_counter()
    return events / (t1 - t0), events / (t2 - t1), (t3 - t2) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        base = Path(tmp)
        drivers: list[tuple[str, Store]] = [
            ("files (fsync)", FileStore(base / "files")),
            ("files (no fsync)", FileStore(base / "files-nosync", fsync=False)),
            ("sqlite (WAL)", SqliteStore(base / "store.db")),
        ]
        print(f"{args.events} events of ~{len(str(_event(1)))} bytes, in {base}")
        print(f"{'driver':<18} {'append ev/s':>12} {'read ev/s':>12} {'last_number µs':>15}")
        for name, store in drivers:
            a, r, last = bench(store, args.events)
            print(f"{name:<18} {a:>12,.0f} {r:>12,.0f} {last:>15,.0f}")
            store.close()


if __name__ == "__main__":
    main()
