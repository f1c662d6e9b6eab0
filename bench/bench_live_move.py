"""``lnk agent move`` of a working agent of many small files, against real SSH hosts.

Starts the SSH test hosts of tests/hosts.py (needs root): hostA and hostB, each its
own HOME behind its own sshd in a network namespace, reached from this computer
(``here``) through ``LNK_SSH_COMMAND``.  Prints one table:

1. **a live agent moved N times, here -> box -> here** (default 20): a writer process
   appends to a log every 5 ms, replaces a file by rename every 50 ms and writes a
   SQLite database in WAL mode while the bulk goes; at the pause it stops (the
   move's ``move:after-bulk`` step: the move runs in this process), and the
   destination must then hold exactly what the source held at that moment (files
   by content, mode and mtime; the database by its rows).  Counts successes.
2. **the pause** (lnk's own ``timings.pause_s``: agent paused -> answering at the
   destination) of a move of an agent of ``--files`` small files (the source-like
   shape of gen_agent.py), with 1 file changed after the bulk, then with 100.
3. **an unchanged move back** of that agent, box to box: wall time and bytes on
   both hosts' links, against ``rsync -a -e ssh`` of the same agent folder from a
   copy to hostB with nothing to update.

    python bench/bench_live_move.py                  # 20 rounds, 100,000 files
    python bench/bench_live_move.py --rounds 3 --files 10000   # a smoke run

Tests never time anything; this is not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE_DIR.parent / "tests" / "payload"))
sys.path.insert(0, str(HERE_DIR.parent / "tests"))
sys.path.insert(0, str(HERE_DIR))

from bench_move import BOX, Bench, med, rsync_peer, wire  # noqa: E402
from gen_agent import generate  # noqa: E402
from hosts import running_hosts  # noqa: E402
from payload_helpers import files_but_writer_db, start_writer, writer_rows  # noqa: E402

from lnk.agents import registry  # noqa: E402
from lnk.agents.layout import Machine  # noqa: E402
from lnk.move import move as mv  # noqa: E402
from lnk.places.where import HERE, set_location  # noqa: E402


def _root(b: Bench, place: str, name: str) -> Path:
    home = b.here if place == HERE else b.hosts["hostA" if place == "a" else "hostB"].home
    return home / "Link" / "Agents" / name


def live_rounds(b: Bench, rounds: int) -> tuple[int, list[str]]:
    """Move a writing agent ``rounds`` times between here and box a; successes, failures."""
    name = "live"
    st = generate(b.here, 20 << 20, files=2000, name=name, seed=5)
    set_location(Machine(b.here), name, st.agent_id, HERE)
    place, ok, failed = HERE, 0, []
    for n in range(rounds):
        to = "a" if place == HERE else HERE
        home = _root(b, place, name) / "Home"
        stop = b.here.parent / "stop"
        stop.unlink(missing_ok=True)
        # a log line every 5 ms, a file replaced by rename every 50 ms, a database row
        # every line
        writer = start_writer(home, stop, 0.005, 10, 1)
        time.sleep(0.2)
        held: dict[str, Any] = {}
        orig = mv.fault

        def hook(
            point: str,
            home: Path = home,
            writer: Any = writer,
            stop: Path = stop,
            held: dict[str, Any] = held,
            orig: Any = orig,
        ) -> None:
            if point == "move:after-bulk":  # the agent pauses: nothing writes any more
                stop.touch()
                writer.wait(30)
                held["files"] = files_but_writer_db(home.parent)
                held["rows"] = writer_rows(home / "state.db")
            orig(point)

        mv.fault = hook
        try:
            mv.move(Machine(b.here), name, to, no_start=True)
            there = _root(b, to, name)
            same = files_but_writer_db(there) == held["files"]
            rows = writer_rows(there / "Home" / "state.db") == held["rows"]
            if same and rows:
                ok += 1
            else:
                failed.append(f"round {n + 1}: files equal {same}, rows equal {rows}")
            place = to
        except Exception as e:  # a bench counts failures, it does not stop
            failed.append(f"round {n + 1}: {type(e).__name__}: {e}")
        finally:
            mv.fault = orig
            stop.touch()
            if writer.poll() is None:
                writer.wait(30)
    return ok, failed


def move_with_changes(b: Bench, name: str, changed: int) -> dict[str, Any]:
    """A move run in this process, ``changed`` small files rewritten after the bulk."""
    src = b.hosts[b.where[name]]
    dst = b.other(name)
    orig = mv.fault
    seed = time.time_ns()

    def hook(point: str) -> None:
        if point == "move:after-bulk":
            a = registry.find(Machine(src.home), name)
            files = sorted((a.folders.home / "src").rglob("*.py"))[:changed]
            for i, f in enumerate(files):
                f.write_bytes(f"# changed {seed} {i}\n".encode() * 20)
        orig(point)

    mv.fault = hook
    try:
        out = mv.move(Machine(b.here), name, BOX[dst.name], no_start=True)
    finally:
        mv.fault = orig
    b.where[name] = dst.name
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="moves of the live agent")
    ap.add_argument("--files", type=int, default=100_000, help="small files of the moved agent")
    ap.add_argument("--repeat", type=int, default=3, help="runs per pause figure (median)")
    a = ap.parse_args(argv)
    rows: list[tuple[str, str, str, str]] = []

    def note(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    import tempfile

    with running_hosts(Path(tempfile.mkdtemp(prefix="lnk-bench-live-")), "live") as hosts:
        here = hosts.root / "here"
        here.mkdir()
        b = Bench(hosts, here, a.repeat)
        b.lnk("box", "add", "a", "hostA")
        b.lnk("box", "add", "b", "hostB")

        note(f"1. a live agent, {a.rounds} moves here <-> box a")
        ok, failed = live_rounds(b, a.rounds)
        for f in failed:
            note("   " + f)
        rows.append(
            (
                f"1 live agent moved {a.rounds}x",
                f"{ok} of {a.rounds} exact",
                "",
                f"{a.rounds} of {a.rounds}: {'PASS' if ok == a.rounds else 'FAIL'}",
            )
        )

        note(f"2. an agent of {a.files:,} small files on hostA")
        st = generate(hosts["hostA"].home, 0, files=a.files, name="small", seed=11)
        set_location(Machine(here), "small", st.agent_id, "a")
        b.where["small"] = "hostA"
        t0 = time.perf_counter()
        cold = b.move_cli("small")
        note(f"   cold move a -> b: {time.perf_counter() - t0:.1f} s")
        pauses: dict[int, list[float]] = {1: [], 100: []}
        for _ in range(a.repeat):
            for changed in (1, 100):
                r = move_with_changes(b, "small", changed)
                pauses[changed].append(r["timings"]["pause_s"])
                note(f"   {changed} changed: pause {r['timings']['pause_s']:.2f} s")
        p1, p100 = med(pauses[1]), med(pauses[100])
        rows += [
            (
                "2 pause, 1 file changed",
                f"{p1:.2f} s",
                "",
                f"<= 2 s: {'PASS' if p1 <= 2 else 'FAIL'}",
            ),
            (
                "2 pause, 100 files changed",
                f"{p100:.2f} s",
                f"{p100 / p1:.2f}x the 1-file pause",
                f"<= 1.5x the 1-file pause: {'PASS' if p100 <= 1.5 * p1 else 'FAIL'}",
            ),
            ("  (cold move, for scale)", f"{cold['wall_s']:.1f} s", "", ""),
        ]

        note("3. unchanged moves back, box to box, and rsync -a over ssh")
        walls, wires, state = [], [], 0
        for _ in range(a.repeat):
            w0 = wire(hosts)
            r = b.move_cli("small")
            walls.append(r["wall_s"])
            wires.append(wire(hosts) - w0)
        for p in b.agent_root("small").rglob("*"):
            if p.is_file() and not p.is_symlink():
                state += p.stat().st_size
        rs = rsync_peer(b, "small")
        lw, ww = med(walls), med(wires)
        rows += [
            (
                "3 unchanged move back: wall",
                f"{lw:.2f} s",
                f"rsync -a {rs['wall_s']:.2f} s ({lw / rs['wall_s']:.2f}x)",
                f"<= 2x rsync: {'PASS' if lw <= 2 * rs['wall_s'] else 'FAIL'}",
            ),
            (
                "3 unchanged move back: wire",
                f"{ww / 1e6:.2f} MB",
                f"state {state / 1e6:.0f} MB ({ww / state:.3%}); rsync {rs['wire_bytes'] / 1e6:.2f} MB",
                f"<= 0.1% of the state: {'PASS' if ww <= 0.001 * state else 'FAIL'}",
            ),
        ]
    head = ("figure", "lnk", "beside it", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    print()
    print(f"{os.cpu_count()} CPUs; {a.files:,} small files; medians of {a.repeat}")
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    shutil.rmtree(hosts.root, ignore_errors=True)


if __name__ == "__main__":
    main()
