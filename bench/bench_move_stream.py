"""Moving a whole agent through the sealed stream, against tar | zstd | age (not a test).

    python bench/bench_move_stream.py [--size 2] [--files N] [--quick] [--big] [--keep]
                                      [--workdir DIR] [--runs 1]

On one generated agent (bench/gen_agent.py) it runs, as real processes:

* lnk, first send: ``lnk agent state-receive --prepare --json`` on HOME B, then
  ``lnk agent state-send --to KEY | lnk agent state-receive --receiver R`` (A -> B);
* the peer: ``tar c | zstd -3 -T0 | age -r KEY | age -d -i KEY | zstd -d | tar x``
  of the agent's folder (its collections included), Debian's zstd and age;
* lnk, second send with nothing changed: a receiver prepared with ``--agent-id``
  on B, its ``--inventory``, ``state-send --inventory`` piped into receive.

and prints one table: MB/s of agent bytes (10^6 per MB), wall seconds, bytes on
the wire, the peak RSS of each side (``wait4`` of every process; the largest of
a side's processes), the ratio against the peer, and whether each target holds.
The page cache is dropped before every run when possible (root); the table
says whether it was.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gen_agent import GIB, generate, tree_bytes

LNK = [sys.executable, "-m", "lnk"]
NAME = "bench"
MIB = 1 << 20
TARGET_RATIO, AIM_RATIO = 1.0, 1.2
TARGET_SECOND_BYTES, TARGET_SECOND_TIME = 0.005, 0.10
TARGET_RSS = 200 * MIB


@dataclass
class Proc:
    name: str
    side: str  # "send" or "receive"
    popen: subprocess.Popen[bytes]
    rc: int = 0
    maxrss: int = 0  # bytes
    wchar: int = 0  # bytes written (from /proc/<pid>/io, read before reaping)
    cpu: float = 0.0  # user + system seconds


@dataclass
class Run:
    label: str
    seconds: float
    wire: int
    rss_send: int
    rss_recv: int
    cpu_send: float = 0.0
    cpu_recv: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _reap(p: Proc) -> None:
    """Wait for exit without reaping, read its I/O counters, then reap with rusage."""
    pid = p.popen.pid
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("wchar:"):
                p.wchar = int(line.split()[1])
    except OSError:
        pass
    _, status, ru = os.wait4(pid, 0)
    p.popen.returncode = p.rc = os.waitstatus_to_exitcode(status)
    p.maxrss = ru.ru_maxrss * 1024
    p.cpu = ru.ru_utime + ru.ru_stime


def pipeline(
    stages: list[tuple[str, str, list[str], dict[str, str] | None]],
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | int | None = None,
    log: Path | None = None,
) -> tuple[float, list[Proc]]:
    """Run ``a | b | c`` (each stage: name, side, argv, env); wall seconds and the procs."""
    procs: list[Proc] = []
    err = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    t0 = time.perf_counter()
    prev: Any = stdin
    try:
        for i, (name, side, argv, env) in enumerate(stages):
            last = i == len(stages) - 1
            pp = subprocess.Popen(
                argv, stdin=prev, stdout=stdout if last else subprocess.PIPE, stderr=err, env=env
            )
            if prev is not None and prev is not stdin:
                prev.close()  # the child holds it now
            prev = pp.stdout
            procs.append(Proc(name, side, pp))
        for p in procs:
            _reap(p)
        seconds = time.perf_counter() - t0
    finally:
        if log:
            err.close()  # type: ignore[union-attr]
    bad = [f"{p.name} exited {p.rc}" for p in procs if p.rc]
    if bad:
        raise SystemExit(f"pipeline failed: {', '.join(bad)}" + (f" (see {log})" if log else ""))
    return seconds, procs


def env_for(home: Path) -> dict[str, str]:
    return os.environ | {"HOME": str(home)}


def lnk_json(home: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run([*LNK, *args], env=env_for(home), check=True, capture_output=True)
    return dict(json.loads(out.stdout))


def lnk_send(
    a: Path, b: Path, work: Path, label: str, agent_id: str | None = None, inventory: bool = False
) -> Run:
    """prepare on B, then send | receive; the prepare (and inventory) are timed apart."""
    t0 = time.perf_counter()
    prep = ["--agent-id", agent_id] if agent_id else []
    info = lnk_json(b, "agent", "state-receive", "--prepare", "--json", *prep)
    rid, key = info["receiver"], info["public_key"]
    send = [
        *LNK,
        "agent",
        "state-send",
        "--agent",
        NAME,
        "--to",
        key,
        "--report",
        str(work / f"{label}-send.json"),
    ]
    if inventory:
        inv = work / f"{label}.inv"
        with open(inv, "wb") as f:
            subprocess.run(
                [*LNK, "agent", "state-receive", "--receiver", rid, "--inventory"],
                env=env_for(b),
                check=True,
                stdout=f,
            )
        send += ["--inventory", str(inv)]
    prepare_s = time.perf_counter() - t0
    cached = drop_caches()
    with open(work / f"{label}-recv.json", "wb") as out:
        seconds, procs = pipeline(
            [
                ("lnk send", "send", send, env_for(a)),
                (
                    "lnk receive",
                    "receive",
                    [*LNK, "agent", "state-receive", "--receiver", rid, "--json"],
                    env_for(b),
                ),
            ],
            stdout=out,
            log=work / "lnk.log",
        )
    rep = json.loads((work / f"{label}-send.json").read_text())
    recv = json.loads((work / f"{label}-recv.json").read_text())
    if not recv.get("committed"):
        raise SystemExit(f"{label}: the receive did not commit: {recv}")
    return Run(
        label,
        seconds,
        int(rep["wire_bytes"]),
        procs[0].maxrss,
        procs[1].maxrss,
        procs[0].cpu,
        procs[1].cpu,
        {
            "prepare_s": prepare_s,
            "dropped": cached,
            "send": rep,
            "receive": recv,
            "pipe_bytes": procs[0].wchar,
        },
    )


def peer_run(a: Path, work: Path) -> Run:
    keyfile = work / "age.key"
    if not keyfile.exists():
        subprocess.run(["age-keygen", "-o", str(keyfile)], check=True, capture_output=True)
    pub = subprocess.run(
        ["age-keygen", "-y", str(keyfile)], check=True, capture_output=True, text=True
    ).stdout.strip()
    dest = work / "peer"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    cached = drop_caches()
    seconds, procs = pipeline(
        [
            ("tar c", "send", ["tar", "-C", str(a / "Link" / "Agents"), "-cf", "-", NAME], None),
            ("zstd -3", "send", ["zstd", "-3", "-T0", "-q", "-c"], None),
            ("age -r", "send", ["age", "-r", pub], None),
            ("age -d", "receive", ["age", "-d", "-i", str(keyfile)], None),
            ("zstd -d", "receive", ["zstd", "-d", "-q", "-c"], None),
            ("tar x", "receive", ["tar", "-C", str(dest), "-xf", "-"], None),
        ],
        log=work / "peer.log",
    )
    wire = next(p.wchar for p in procs if p.name == "age -r")
    return Run(
        "peer",
        seconds,
        wire,
        max(p.maxrss for p in procs if p.side == "send"),
        max(p.maxrss for p in procs if p.side == "receive"),
        sum(p.cpu for p in procs if p.side == "send"),
        sum(p.cpu for p in procs if p.side == "receive"),
        {"dropped": cached, "procs": {p.name: p.maxrss for p in procs}},
    )


def rsync_run(a: Path, work: Path) -> Run:
    """``rsync -a`` of the agent into the copy the peer made (nothing changed): what an
    unchanged move back is held to."""
    cached = drop_caches()
    seconds, procs = pipeline(
        [
            (
                "rsync -a",
                "send",
                ["rsync", "-a", str(a / "Link" / "Agents" / NAME) + "/", str(work / "peer" / NAME)],
                None,
            )
        ],
        log=work / "rsync.log",
    )
    p = procs[0]
    return Run("rsync", seconds, p.wchar, p.maxrss, p.maxrss, p.cpu, 0.0, {"dropped": cached})


def check_same(a: Path, b: Path) -> None:
    for sub in ("Home", "Agent"):
        src = tree_bytes(a / "Link" / "Agents" / NAME / sub)
        dst = tree_bytes(b / "Link" / "Agents" / NAME / sub)
        if src != dst:
            raise SystemExit(f"{sub}: sent {src} (files, bytes) but {dst} arrived")


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]


def report(
    state: int, gen: dict[str, Any], first: Run, peer: Run, second: Run, runs: dict[str, list[Run]]
) -> bool:
    rows = []
    for r in (first, peer, second):
        ratio = (peer.seconds / r.seconds) if r is not second else None
        n = len(runs[r.label])
        rows.append(
            [
                r.label,
                f"{state / r.seconds / 1e6:,.0f}",
                f"{r.seconds:.2f}",
                f"({n}x: " + ",".join(f"{x.seconds:.1f}" for x in runs[r.label]) + ")",
                mb(r.wire),
                f"{r.rss_send / MIB:.0f}",
                f"{r.rss_recv / MIB:.0f}",
                f"{r.cpu_send:.1f}",
                f"{r.cpu_recv:.1f}",
                f"{ratio:.2f}x" if ratio else "-",
            ]
        )
    head = [
        "run",
        "MB/s",
        "wall s",
        "runs",
        "wire MB",
        "RSS send MiB",
        "RSS recv MiB",
        "CPU s send",
        "CPU s recv",
        "vs peer",
    ]
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    print()
    print(
        f"state: {mb(state)} MB ({gen.get('files')} files, {gen.get('events')} events in "
        f"{gen.get('conversations')} conversations, store {gen.get('store')}); "
        f"{os.cpu_count()} CPUs; page cache "
        f"{'dropped before each run' if first.extra['dropped'] else 'NOT dropped (not root)'}"
    )
    for row in [head, *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))
    print(
        f"second send: receiver prepare + inventory {second.extra['prepare_s']:.2f} s "
        f"(not in its wall time); first send's prepare {first.extra['prepare_s']:.2f} s"
    )
    ratio = peer.seconds / first.seconds
    rss = max(first.rss_send, first.rss_recv, second.rss_send, second.rss_recv)
    checks = [
        (f"throughput >= peer ({ratio:.2f}x; aim {AIM_RATIO}x)", ratio >= TARGET_RATIO),
        (
            f"second send bytes <= {TARGET_SECOND_BYTES:.1%} of the first "
            f"({second.wire / first.wire:.2%})",
            second.wire <= TARGET_SECOND_BYTES * first.wire,
        ),
        (
            f"second send time <= {TARGET_SECOND_TIME:.0%} of the first "
            f"({second.seconds / first.seconds:.1%})",
            second.seconds <= TARGET_SECOND_TIME * first.seconds,
        ),
        (f"peak RSS of either side <= 200 MiB ({rss / MIB:.0f} MiB)", rss <= TARGET_RSS),
    ]
    if runs.get("rsync"):
        rs = runs["rsync"][0].seconds
        both = second.seconds + second.extra["prepare_s"]
        print(
            f"unchanged move back: lnk second {second.seconds:.2f} s (+ prepare/inventory "
            f"{both:.2f} s) vs rsync -a {rs:.2f} s: {second.seconds / rs:.2f}x "
            f"({both / rs:.2f}x with prepare)"
        )
        checks.append(
            (f"unchanged move back <= 2x rsync -a ({both / rs:.2f}x with prepare)", both <= 2 * rs)
        )
    ok = True
    for text, good in checks:
        print(f"  [{'PASS' if good else 'FAIL'}] {text}")
        ok = ok and good
    return ok


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=float, default=2.0, help="GiB of agent state (default 2)")
    p.add_argument("--files", type=int, help="small-files mode: this many files")
    p.add_argument("--quick", action="store_true", help="about 200 MiB, a smoke run")
    p.add_argument("--big", action="store_true", help="1,000,000 small files (memory bound)")
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="repeat the first send and the peer; medians are reported",
    )
    p.add_argument("--store", choices=["files", "sqlite"], default="files")
    p.add_argument("--workdir", type=Path, help="reuse (or make) the generated agent here")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--warm-hashes",
        action="store_true",
        help="keep the sender's hash cache between first sends (default: cleared)",
    )
    p.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    a = p.parse_args(argv)
    size = int((0.2 if a.quick else a.size) * GIB)
    files = 1_000_000 if a.big else a.files
    work = a.workdir or Path(tempfile.mkdtemp(prefix="lnk-bench-move-"))
    work.mkdir(parents=True, exist_ok=True)
    home_a, home_b = work / "a", work / "b"
    try:
        marker = work / "gen.json"
        want = {"size": size, "files": files, "store": a.store}
        gen: dict[str, Any] = json.loads(marker.read_text()) if marker.exists() else {}
        if gen.get("params") != want:
            shutil.rmtree(home_a, ignore_errors=True)
            print(f"generating the agent in {home_a} ...", flush=True)
            stats = generate(home_a, size, files=files, store=a.store, name=NAME)
            gen = stats.to_json() | {"params": want}
            marker.write_text(json.dumps(gen))
            print(f"  {mb(stats.total_bytes)} MB in {stats.seconds:.0f} s", flush=True)
        state = tree_bytes(home_a / "Link" / "Agents" / NAME)[1]
        runs: dict[str, list[Run]] = {"lnk first": [], "peer": [], "lnk second": []}
        for i in range(a.runs):
            shutil.rmtree(home_b, ignore_errors=True)
            home_b.mkdir()
            print(f"run {i + 1}/{a.runs}: lnk first send ...", flush=True)
            if not a.warm_hashes:  # a first send hashes every file
                for c in (home_a / ".lnk" / "agents").glob(f"{gen['agent_id']}/hashes.sqlite*"):
                    c.unlink()
            r = lnk_send(home_a, home_b, work, "lnk first")
            check_same(home_a, home_b)
            runs["lnk first"].append(r)
            print(f"  {r.seconds:.2f} s; peer ...", flush=True)
            runs["peer"].append(peer_run(home_a, work))
            print(f"  {runs['peer'][-1].seconds:.2f} s", flush=True)
        print("lnk second send (inventory, nothing changed) ...", flush=True)
        runs["lnk second"].append(
            lnk_send(home_a, home_b, work, "lnk second", agent_id=gen["agent_id"], inventory=True)
        )
        check_same(home_a, home_b)
        print("rsync -a into the peer's copy (nothing changed) ...", flush=True)
        runs["rsync"] = [rsync_run(home_a, work)]
        shutil.rmtree(work / "peer", ignore_errors=True)
        first, peer, second = (median_run(runs[k]) for k in ("lnk first", "peer", "lnk second"))
        ok = report(state, gen, first, peer, second, runs)
        if a.json:
            a.json.write_text(
                json.dumps(
                    {k: [vars(r) for r in v] for k, v in runs.items()}, indent=1, default=str
                )
            )
        print(
            f"median of {a.runs} run(s); lnk MB/s median "
            f"{statistics.median(state / r.seconds / 1e6 for r in runs['lnk first']):,.0f}"
        )
        sys.exit(0 if ok else 1)
    finally:
        if not a.keep and not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
