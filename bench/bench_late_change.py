"""Issue 21: a file written after the final's inventory, in one process (no SSH).

Makes an agent of ``--files`` small files (gen_agent.py's shape) on one machine,
sends it whole to a second, then, ``--rounds`` times: takes the sender's digests
(with the file-system clock, ``at``), the receiver's inventory against them, rewrites
one file the inventory's folders hold, and sends and receives again with that
inventory; once with ``at`` given back (what is unchanged since is known) and once
without (an older receiver: the changed folder goes whole).  Prints the send's data
and wire bytes, the entries it wrote, and the receive's time.

    python bench/bench_late_change.py [--files 100000] [--rounds 3]

Tests never time anything; this is not a test.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE_DIR))
sys.path.insert(0, str(HERE_DIR.parent))

from gen_agent import generate  # noqa: E402

from lnk.agents import registry  # noqa: E402
from lnk.agents.layout import Machine  # noqa: E402
from lnk.payload import receivers  # noqa: E402
from lnk.payload.folders import clock, sending_digests  # noqa: E402
from lnk.payload.receive import receive  # noqa: E402
from lnk.payload.send import send_agent  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="lnk-bench-late-", dir="/dev/shm"))
    try:
        src, dst = Machine(work / "a"), Machine(work / "b")
        src.home.mkdir()
        dst.home.mkdir()
        generate(src.home, 0, files=a.files, name="late", seed=5)
        agent = registry.find(src, "late")
        r = receivers.prepare(dst, agent.id)
        stream = work / "stream"
        with open(stream, "wb") as f:
            send_agent(agent, f, r.key().public)
        with open(stream, "rb") as f:
            assert receive(dst, r.rid, f).committed
        files = sorted(p for p in (agent.folders.home / "many").rglob("*") if p.is_file())
        rng = random.Random(7)
        rows: list[tuple[str, int, int, int, int, float]] = []
        time.sleep(0.1)  # what was placed is older than the digests' margin (50 ms)
        for n in range(a.rounds):
            for given in (False, True):
                cache = agent.runtime / "hashes.sqlite"
                r = receivers.prepare(dst, agent.id)
                at = clock(agent.folders.root)
                inv = r.inventory(sending_digests(agent.folders.root, cache), at=at if given else 0)
                victim = rng.choice(files)  # the agent writes, after the inventory
                victim.write_bytes(f"changed {n} {given}\n".encode() * 20)
                with open(stream, "wb") as f:
                    rep = send_agent(agent, f, r.key().public, inventory=inv)
                t = time.perf_counter()
                with open(stream, "rb") as f:
                    assert receive(dst, r.rid, f).committed
                took = time.perf_counter() - t
                label = "at given back" if given else "no at (before)"
                rows.append(
                    (label, rep.data_bytes, os.path.getsize(stream), rep.entries,
                     rep.kept_folders, took)
                )  # fmt: skip
                time.sleep(0.1)  # the next round's inventory: the change is older
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{a.files:,} files; one file rewritten after the inventory; {a.rounds} rounds")
    print("| inventory | data bytes | wire bytes | entries | held whole | receive s |")
    print("|---|---|---|---|---|---|")
    for label, data, wire, entries, kept, took in rows:
        print(f"| {label} | {data:,} | {wire:,} | {entries:,} | {kept} | {took:.2f} |")


if __name__ == "__main__":
    main()
