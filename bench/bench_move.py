"""``lnk agent move`` box to box against real SSH hosts, beside its peers.

Starts the SSH test hosts of tests/hosts.py (needs root): hostA and hostB, each
its own HOME behind its own sshd, reached from this computer through
``LNK_SSH_COMMAND="ssh -F <config>"``.  Generates agents with bench/gen_agent.py
straight into hostA's HOME, tells this computer's lnk the agent is on box ``a``,
then measures and prints ONE table:

1. cold move of the mixed state (75% incompressible files, 25% JSON-like
   conversations: half .jsonl files, half events in the agent's store) a -> b
   through this computer, against ``ssh A 'tar c DIR | zstd -3' | ssh B 'zstd -d
   | tar x'`` (wall time) and ``ssh A cat FILE | ssh B 'cat >/dev/null'`` (byte
   rate) on the same data, same cipher;
2. the pause (from ``agent pause`` until the agent answers at the destination,
   lnk's own ``timings.pause_s``) with 1 MiB changed between bulk and pause
   (512 KiB new file + 512 KiB of events, written by a hook on the move's
   ``move:after-bulk`` step, so the move runs in this process), for each
   ``--history`` size;
3. a move back with nothing changed: bytes on the wire (all traffic on both
   hosts' links, both directions, so relayed bytes count twice) against the
   state's bytes, and its wall time against ``rsync -a -e "ssh -F ..."`` of a
   local copy of the same folder from this computer to hostB with nothing to
   update (one hop; the move crosses two);
4. the SSH cipher through two hops: raw pipe and cold move with OpenSSH's
   default cipher and with ``-c aes128-gcm@openssh.com``.

    python bench/bench_move.py --quick              # a smoke run, small sizes
    python bench/bench_move.py                       # 2 GiB; history 0.1, 1 GiB
    python bench/bench_move.py --history 0.1,1,4,10  # the full pause target

Every figure is the median of ``--repeat`` runs.  Tests never time anything;
this is not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE_DIR.parent / "tests"))
sys.path.insert(0, str(HERE_DIR))

from gen_agent import GIB, KIB, MIB, Chatter, RandomBytes, generate  # noqa: E402
from hosts import Host, Hosts, running_hosts  # noqa: E402

from lnk.agents import registry  # noqa: E402
from lnk.agents.layout import Machine  # noqa: E402
from lnk.agents.stores import open_agent_store  # noqa: E402
from lnk.collections import CollectionId  # noqa: E402
from lnk.places.where import set_location  # noqa: E402

GCM = "aes128-gcm@openssh.com"
BOX = {"hostA": "a", "hostB": "b"}
Row = tuple[str, str, str, str, str]


# ---- helpers ----------------------------------------------------------------
def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def wire(hosts: Hosts) -> int:
    """Bytes through both hosts' links so far, in and out."""
    total = 0
    for h in (hosts["hostA"], hosts["hostB"]):
        for d in ("rx_bytes", "tx_bytes"):
            total += int(Path(f"/sys/class/net/{h.veth}/statistics/{d}").read_text())
    return total


def sh(line: str) -> float:
    """Wall seconds of one shell pipeline (which must succeed)."""
    t = time.perf_counter()
    r = subprocess.run(line, shell=True, capture_output=True)
    dt = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"{line}\n-> {r.returncode}: {r.stderr.decode()[-2000:]}")
    return dt


class Bench:
    def __init__(self, hosts: Hosts, here: Path, repeat: int) -> None:
        self.hosts = hosts
        self.here = here
        self.repeat = repeat
        self.where: dict[str, str] = {}  # agent name -> host name it is on now
        os.environ["HOME"] = str(here)
        os.environ["LNK_SSH_COMMAND"] = hosts.ssh_command
        os.environ["LNK_TESTING"] = "1"

    def ssh(self, cipher: str | None) -> str:
        return self.hosts.ssh_command + (f" -c {cipher}" if cipher else "")

    def lnk(self, *args: str, cipher: str | None = None) -> str:
        env = dict(os.environ, LNK_SSH_COMMAND=self.ssh(cipher))
        r = subprocess.run([sys.executable, "-m", "lnk", *args], env=env, capture_output=True)
        if r.returncode:
            raise RuntimeError(f"lnk {' '.join(args)} -> {r.returncode}: {r.stderr.decode()}")
        return r.stdout.decode()

    def make(self, name: str, size: int) -> tuple[int, float]:
        """Generate agent ``name`` on hostA; (state bytes, seconds it took)."""
        st = generate(self.hosts["hostA"].home, size, name=name, seed=len(name) + size % 97)
        set_location(Machine(self.here), name, st.agent_id, "a")
        self.where[name] = "hostA"
        return st.total_bytes, st.seconds

    def other(self, name: str) -> Host:
        return self.hosts["hostB" if self.where[name] == "hostA" else "hostA"]

    def forget_moved(self, host: Host) -> None:
        """Drop what a host keeps of agents that left it, so the next move there is cold."""
        shutil.rmtree(host.home / "Link" / "Moved", ignore_errors=True)
        shutil.rmtree(host.home / ".lnk" / "moved", ignore_errors=True)

    def move_cli(self, name: str, cipher: str | None = None) -> dict[str, Any]:
        """``lnk agent move`` to the other host; its JSON plus wall and wire bytes."""
        dst = self.other(name)
        w0, t0 = wire(self.hosts), time.perf_counter()
        out = json.loads(
            self.lnk(
                "agent", "move", "--agent", name, "--to", BOX[dst.name], "--json", cipher=cipher
            )
        )
        out["wall_s"] = time.perf_counter() - t0
        out["wire_bytes"] = wire(self.hosts) - w0
        self.where[name] = dst.name
        return out

    def move_changed(self, name: str) -> dict[str, Any]:
        """A move run in this process, 1 MiB changed at the source after the bulk."""
        from lnk.move import move as mv

        src = self.hosts[self.where[name]]
        dst = self.other(name)
        orig = mv.fault
        seed = int(time.time() * 1000) % 100000

        def hook(point: str) -> None:
            if point == "move:after-bulk":
                change_1mib(src.home, name, seed)
            orig(point)

        mv.fault = hook
        try:
            out = mv.move(Machine(self.here), name, BOX[dst.name])
        finally:
            mv.fault = orig
        self.where[name] = dst.name
        return out

    def agent_root(self, name: str) -> Path:
        return self.hosts[self.where[name]].home / "Link" / "Agents" / name


def change_1mib(home: Path, name: str, seed: int) -> None:
    """512 KiB of a new file and 512 KiB of new events in the agent at ``home``."""
    a = registry.find(Machine(home), name)
    d = a.folders.home / "changed"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"c{seed}.bin").write_bytes(RandomBytes(seed, "change").take(512 * KIB))
    store = open_agent_store(a.folders.chats, a.settings.store, a.settings.lapse_s)
    try:
        cid = CollectionId("events", "link:conv-0000")
        n = store.last_number(cid) + 1
        chatter, size = Chatter(seed), 0
        evs: list[dict[str, Any]] = []
        while size < 512 * KIB:
            ev = chatter.event(0, n + len(evs))
            evs.append(ev)
            size += len(json.dumps(ev, separators=(",", ":")))
        store.append_many(cid, n, evs)
    finally:
        store.close()


# ---- the measurements ----------------------------------------------------------
def peers(b: Bench, name: str, state: int, cipher: str | None) -> dict[str, float]:
    """tar|zstd box to box and the raw pipe's byte rate, through this computer."""
    src = b.hosts[b.where[name]]
    dst = b.other(name)
    root = b.agent_root(name)
    ssh = b.ssh(cipher)
    raw = src.dir / "raw.bin"
    if not raw.exists():
        rb = RandomBytes(7, "raw")
        with raw.open("wb") as f:
            left = state
            while left:
                n = min(left, 4 * MIB)
                f.write(rb.take(n))
                left -= n
    tar_s, raw_s = [], []
    for _ in range(b.repeat):
        out = dst.dir / "tar-peer"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        tar_s.append(
            sh(
                f"{ssh} {src.name} -- 'tar c -C {root} . | zstd -q -3 -T1' | "
                f"{ssh} {dst.name} -- 'zstd -q -d | tar x -C {out}'"
            )
        )
        shutil.rmtree(out, ignore_errors=True)
        raw_s.append(sh(f"{ssh} {src.name} -- 'cat {raw}' | {ssh} {dst.name} -- 'cat >/dev/null'"))
    return {"tar_s": med(tar_s), "raw_rate": state / med(raw_s)}


def cold_moves(b: Bench, name: str, cipher: str | None) -> dict[str, float]:
    walls, pauses, bulks = [], [], []
    for _ in range(b.repeat):
        b.forget_moved(b.other(name))
        r = b.move_cli(name, cipher)
        walls.append(r["wall_s"])
        pauses.append(r["timings"]["pause_s"])
        bulks.append(r["timings"]["bulk_s"])
    return {"wall_s": med(walls), "pause_s": med(pauses), "bulk_s": med(bulks)}


def moves_back(b: Bench, name: str) -> dict[str, float]:
    """Moves back to where the agent was just before, nothing changed since."""
    walls, wires, data = [], [], []
    for _ in range(b.repeat):
        r = b.move_cli(name)
        walls.append(r["wall_s"])
        wires.append(r["wire_bytes"])
        data.append(r["bulk"]["data_bytes"] + r["final"]["data_bytes"])
    return {"wall_s": med(walls), "wire_bytes": med(wires), "data_bytes": med(data)}


def rsync_peer(b: Bench, name: str) -> dict[str, float]:
    """rsync -a of a local copy to hostB with nothing to update: wall and wire bytes."""
    copy = b.here.parent / "rsync-src"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(b.agent_root(name), copy, symlinks=True)
    dst = b.hosts["hostB"].dir / "rsync-dst"
    line = f"rsync -a -e '{b.ssh(None)}' {copy}/ hostB:{dst}/"
    sh(line)  # the first one copies everything
    walls, wires = [], []
    for _ in range(b.repeat):
        w0 = wire(b.hosts)
        walls.append(sh(line))
        wires.append(wire(b.hosts) - w0)
    shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)
    return {"wall_s": med(walls), "wire_bytes": med(wires)}


def pauses(b: Bench, size: int) -> tuple[int, float, list[float]]:
    name = f"h{size // MIB}m"
    state, _ = b.make(name, size)
    got = [b.move_changed(name)["timings"]["pause_s"] for _ in range(b.repeat)]
    host = b.hosts[b.where[name]]
    b.lnk("box", "run", BOX[host.name], "--", "agent", "stop", "--agent", name)
    return state, med(got), got


# ---- the table -----------------------------------------------------------------
def fmt_b(n: float) -> str:
    return (
        f"{n / GIB:.2f} GiB"
        if n >= GIB
        else f"{n / MIB:.1f} MiB"
        if n >= MIB
        else f"{n / KIB:.1f} KiB"
    )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_table(rows: list[Row]) -> None:
    head: Row = ("figure", "lnk", "peer", "ratio", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def run(a: argparse.Namespace, hosts: Hosts, note: Callable[[str], None]) -> list[Row]:
    here = hosts.root / "here"
    here.mkdir()
    b = Bench(hosts, here, a.repeat)
    b.lnk("box", "add", "a", "hostA")
    b.lnk("box", "add", "b", "hostB")
    rows: list[Row] = []

    note(f"generating a {a.size / GIB:.2f} GiB agent on hostA")
    state, gen_s = b.make("bench", a.size)
    note(f"  {fmt_b(state)} in {gen_s:.0f} s; peers")
    p = peers(b, "bench", state, None)
    pg = peers(b, "bench", state, GCM)
    note("cold moves, default cipher")
    cold = cold_moves(b, "bench", None)
    note("cold moves, aes128-gcm")
    cold_g = cold_moves(b, "bench", GCM)
    rate = state / cold["wall_s"]
    rows += [
        (
            f"1 cold move wall, {fmt_b(state)}",
            f"{cold['wall_s']:.2f} s",
            f"{p['tar_s']:.2f} s",
            f"{cold['wall_s'] / p['tar_s']:.2f}",
            f"<= tar|zstd: {verdict(cold['wall_s'] <= p['tar_s'])}",
        ),
        (
            "1 cold move state rate",
            f"{rate / MIB:.0f} MiB/s",
            f"{p['raw_rate'] / MIB:.0f} MiB/s",
            f"{rate / p['raw_rate']:.2f}",
            f">= 0.70 raw: {verdict(rate >= 0.7 * p['raw_rate'])}",
        ),
        ("  (cold: bulk / pause)", f"{cold['bulk_s']:.2f} / {cold['pause_s']:.2f} s", "", "", ""),
    ]
    note("moves back, nothing changed")
    back = moves_back(b, "bench")
    note("rsync peer")
    rs = rsync_peer(b, "bench")
    rows += [
        (
            "3 move back: wire bytes",
            fmt_b(back["wire_bytes"]),
            f"state {fmt_b(state)}",
            f"{back['wire_bytes'] / state:.4f}",
            f"<= 0.005: {verdict(back['wire_bytes'] <= 0.005 * state)}",
        ),
        (
            "3 move back: wall",
            f"{back['wall_s']:.2f} s",
            f"rsync {rs['wall_s']:.2f} s",
            f"{back['wall_s'] / rs['wall_s']:.2f}",
            f"<= rsync: {verdict(back['wall_s'] <= rs['wall_s'])}",
        ),
        (
            "  (move back file data sent / rsync wire)",
            fmt_b(back["data_bytes"]),
            fmt_b(rs["wire_bytes"]),
            "",
            "",
        ),
    ]
    base: float | None = None
    for gib in a.history:
        size = int(gib * GIB)
        note(f"pauses with {fmt_b(size)} of history")
        hist, pause, got = pauses(b, size)
        note("  " + " ".join(f"{g:.2f}" for g in got))
        if base is None:
            base = pause
            rows.append(
                (
                    f"2 pause, {fmt_b(hist)} history",
                    f"{pause:.2f} s",
                    "",
                    "",
                    f"<= 2 s: {verdict(pause <= 2)}",
                )
            )
        else:
            ok = pause <= 2 and pause <= 1.5 * base
            rows.append(
                (
                    f"2 pause, {fmt_b(hist)} history",
                    f"{pause:.2f} s",
                    f"{base:.2f} s (first)",
                    f"{pause / base:.2f}",
                    f"<= 2 s, <= 1.5x: {verdict(ok)}",
                )
            )
    g_rate = state / cold_g["wall_s"]
    rows += [
        (
            "4 raw pipe A->here->B",
            f"gcm {pg['raw_rate'] / MIB:.0f} MiB/s",
            f"default {p['raw_rate'] / MIB:.0f} MiB/s",
            f"{pg['raw_rate'] / p['raw_rate']:.2f}",
            "info",
        ),
        (
            "4 cold move rate",
            f"gcm {g_rate / MIB:.0f} MiB/s",
            f"default {rate / MIB:.0f} MiB/s",
            f"{g_rate / rate:.2f}",
            "info",
        ),
        (
            "4 tar|zstd wall",
            f"gcm {pg['tar_s']:.2f} s",
            f"default {p['tar_s']:.2f} s",
            f"{pg['tar_s'] / p['tar_s']:.2f}",
            "info",
        ),
    ]
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--size", type=float, default=2.0, help="GiB of the cold-move agent")
    ap.add_argument(
        "--history",
        default="0.1,1",
        help="GiB of history for the pause, comma-separated; the first is the base",
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    ap.add_argument("--keep", action="store_true", help="keep the hosts' folders")
    a = ap.parse_args(argv)
    if a.quick:
        a.size, a.history, a.repeat = 0.0625, "0.01,0.05", min(a.repeat, 2)
    a.size = int(a.size * GIB)
    a.history = [float(x) for x in a.history.split(",")]
    root = Path(tempfile.mkdtemp(prefix="lnk-bench-move-"))
    t0 = time.perf_counter()

    def note(s: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] {s}", file=sys.stderr, flush=True)

    try:
        (root / "hosts").mkdir()
        with running_hosts(root / "hosts") as hosts:
            rows = run(a, hosts, note)
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"lnk agent move, hostA -> this computer -> hostB, {os.cpu_count()} cores, "
        f"median of {a.repeat}"
    )
    print_table(rows)


if __name__ == "__main__":
    main()
