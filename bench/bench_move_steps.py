"""Issue 21, "fewer steps per move": two lnk trees side by side, one run, real SSH hosts.

Starts the SSH test hosts of tests/hosts.py (needs root), makes one agent of
``--files`` small files (gen_agent.py's source-like shape) on hostA, and moves
it box to box through this computer with each tree in turn (``--before DIR``,
e.g. an export of the commit before, and this tree), interleaved, so both see
the same machine and the same agent:

* **first move's pause**: a fresh agent of as many files moved once with each tree,
  to a box that never held it, one file changed after the bulk (one run each);
* **unchanged move back**: ``lnk agent move`` with nothing changed: wall time,
  bytes on both hosts' links, and the SSH connections both sshds accepted;
  beside it ``rsync -a -e ssh`` of a copy of the agent with nothing to update;
* **pause, one file changed**: one file rewritten after the bulk (the mover's
  ``move:after-bulk`` point, in a child process of that tree); lnk's own
  ``timings.pause_s`` (agent paused -> answering at the destination); and the same
  with the file rewritten once the agent is paused (``move:after-pause``: after the
  final's inventory named its folder held whole), with the final's data bytes.

Each tree runs on both ends: here with ``PYTHONPATH=DIR``, on the boxes with
``LNK_REMOTE_LNK="env PYTHONPATH=DIR python3 -m lnk"``.

    python bench/bench_move_steps.py --before /tmp/lnk-before --files 100000 --repeat 3

Tests never time anything; this is not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE_DIR.parent / "tests"))
sys.path.insert(0, str(HERE_DIR))

from bench_move import BOX, Bench, med, rsync_peer, wire  # noqa: E402
from gen_agent import generate  # noqa: E402
from hosts import Hosts, running_hosts  # noqa: E402

from lnk.agents.layout import Machine  # noqa: E402
from lnk.places.where import set_location  # noqa: E402

NAME = "steps"

# run in a child process of the tree measured: a move with one file changed after the bulk
CHANGED = """
import json, sys, time
from pathlib import Path
from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.move import move as mv
here, src_home, name, to, at = sys.argv[1:6]
orig = mv.fault
def hook(point):
    if point == at:
        a = registry.find(Machine(Path(src_home)), name)
        f = next(p for p in (a.folders.home / "many").rglob("*.txt"))
        f.write_bytes(f"# changed {time.time_ns()}\\n".encode() * 20)
    orig(point)
mv.fault = hook
out = mv.move(Machine(Path(here)), name, to, no_start=True)
print(json.dumps(out["timings"] | {"final_bytes": out["final"]["data_bytes"]}))
"""


# with --trace: an ssh that logs when each step started and ended (its own start, about
# 50 ms, is in every step's time: a breakdown, not a figure)
TRACER = """
import json, os, subprocess, sys, time
t0 = time.time()
args = sys.argv[1:]
code = subprocess.run(args).returncode
cmd = args[args.index("--") + 1] if "--" in args else " ".join(args[-4:])
with open(os.environ["LNK_BENCH_TRACE"], "a") as f:
    f.write(json.dumps({"t0": t0, "t1": time.time(), "cmd": cmd}) + "\\n")
sys.exit(code if code >= 0 else 255)
"""


def print_trace(path: Path, started: float, title: str) -> None:
    """Each ssh command of one move: when it started (from the move's start), how long."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    print(f"\n{title}: the move's ssh commands (start s, duration s, command)")
    busy = 0.0
    for r in sorted(rows, key=lambda r: r["t0"]):
        d = r["t1"] - r["t0"]
        busy += d
        # (the paths, the caller's flags and the box's lnk left out: the step's words)
        words = [
            w
            for w in shlex.split(r["cmd"])
            if not w.startswith("/") and "PYTHONPATH" not in w and w not in ("-I", "-S")
        ]
        print(f"  {r['t0'] - started:6.2f} {d:6.2f}  {' '.join(words)[:110]}")
    print(f"  {len(rows)} commands, {busy:.2f} s in them (overlapping pipes count twice)")


def accepted(hosts: Hosts) -> int:
    """SSH connections both hosts' sshds accepted so far."""
    n = 0
    for h in ("hostA", "hostB"):
        n += (hosts[h].dir / "sshd.log").read_text(errors="replace").count("Accepted publickey")
    return n


def tree_env(tree: Path) -> dict[str, str]:
    """Run ``tree``'s lnk here and on the boxes (and check it is that one)."""
    return dict(
        os.environ,
        PYTHONPATH=str(tree),
        LNK_REMOTE_LNK=f"env PYTHONPATH={tree} python3 -m lnk",
    )


def unchanged(b: Bench, tree: Path, trace: Path | None = None) -> dict[str, float]:
    dst = b.other(NAME)
    env = tree_env(tree)
    if trace is not None:
        tracer = trace.with_suffix(".py")
        tracer.write_text(TRACER)
        trace.unlink(missing_ok=True)
        env |= {
            "LNK_SSH_COMMAND": f"{sys.executable} {tracer} {b.ssh(None)}",
            "LNK_BENCH_TRACE": str(trace),
        }
    w0, c0, t0 = wire(b.hosts), accepted(b.hosts), time.perf_counter()
    started = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "lnk", "agent", "move", "--agent", NAME, "--to", BOX[dst.name]],
        env=env,
        capture_output=True,
        cwd="/",  # python -m puts its working folder first on sys.path
    )
    wall = time.perf_counter() - t0
    if trace is not None and r.returncode == 0:
        print_trace(trace, started, f"{tree}: unchanged move back, {wall:.2f} s")
    if r.returncode:
        raise RuntimeError(f"move with {tree}: {r.stderr.decode()[-2000:]}")
    b.where[NAME] = dst.name
    return {"wall_s": wall, "wire": wire(b.hosts) - w0, "conns": accepted(b.hosts) - c0}


def one_changed(b: Bench, tree: Path, name: str = NAME) -> float:
    return moved_with_one_change(b, tree, name)["pause_s"]


def moved_with_one_change(
    b: Bench, tree: Path, name: str, at: str = "move:after-bulk"
) -> dict[str, float]:
    """A move with one file changed at the mover's point ``at`` (after the bulk, or
    after the pause: after the final's inventory): its timings (pause_s, total_s) and
    the final's data bytes (final_bytes)."""
    src, dst = b.hosts[b.where[name]], b.other(name)
    args = [str(b.here), str(src.home), name, BOX[dst.name], at]
    r = subprocess.run(
        [sys.executable, "-c", CHANGED, *args], env=tree_env(tree), capture_output=True, cwd="/"
    )
    if r.returncode:
        raise RuntimeError(f"changed move with {tree}: {r.stderr.decode()[-2000:]}")
    b.where[name] = dst.name
    t = json.loads(r.stdout.decode().strip().splitlines()[-1])
    return {k: float(t[k]) for k in ("pause_s", "total_s", "final_bytes")}


def first_move(b: Bench, tree: Path, name: str, files: int, seed: int) -> dict[str, float]:
    """The pause of an agent's first move, to a box that never held it (its final
    places every file from what the bulk brought), one file changed after the bulk."""
    st = generate(b.hosts["hostA"].home, 0, files=files, name=name, seed=seed)
    set_location(Machine(b.here), name, st.agent_id, "a")
    b.where[name] = "hostA"
    return moved_with_one_change(b, tree, name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the lnk tree to compare with")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--trace", action="store_true", help="then one traced unchanged move with each tree"
    )
    a = ap.parse_args(argv)
    trees = {"before": a.before.resolve(), "after": HERE_DIR.parent}

    def note(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    for tree in trees.values():
        r = subprocess.run(
            [sys.executable, "-c", "import lnk; print(lnk.__file__)"],
            env=tree_env(tree),
            capture_output=True,
            cwd="/",
            check=True,
        )
        assert r.stdout.decode().startswith(str(tree)), (tree, r.stdout)

    with running_hosts(Path(tempfile.mkdtemp(prefix="lnk-bench-steps-")), "s") as hosts:
        here = hosts.root / "here"
        here.mkdir()
        b = Bench(hosts, here, a.repeat)
        b.lnk("box", "add", "a", "hostA")
        b.lnk("box", "add", "b", "hostB")
        st = generate(hosts["hostA"].home, 0, files=a.files, name=NAME, seed=11)
        set_location(Machine(here), NAME, st.agent_id, "a")
        b.where[NAME] = "hostA"
        note(f"{a.files:,} files made in {st.seconds:.0f} s")
        for tree in trees.values():  # warm: each tree's first moves (a -> b -> a)
            unchanged(b, tree)
        res: dict[str, dict[str, list[float]]] = {
            k: {f: [] for f in ("wall_s", "wire", "conns", "pause_s", "late_s", "late_b")}
            for k in trees
        }
        for n in range(a.repeat):
            for k, tree in trees.items():
                u = unchanged(b, tree)
                for f in ("wall_s", "wire", "conns"):
                    res[k][f].append(u[f])
                res[k]["pause_s"].append(one_changed(b, tree))
                late = moved_with_one_change(b, tree, NAME, "move:after-pause")
                res[k]["late_s"].append(late["pause_s"])
                res[k]["late_b"].append(late["final_bytes"])
                note(f"{n + 1} {k}: {u} pause {res[k]['pause_s'][-1]:.2f} s")
        first = {
            k: first_move(b, tree, f"first-{k}", a.files, 20 + i)
            for i, (k, tree) in enumerate(trees.items())
        }
        note(f"first moves' pauses: {first}")
        if a.trace:
            for tree in trees.values():
                unchanged(b, tree, hosts.root / "trace.jsonl")
        state = sum(p.stat().st_size for p in b.agent_root(NAME).rglob("*") if p.is_file())
        rs = rsync_peer(b, NAME)
    shutil.rmtree(hosts.root, ignore_errors=True)  # the agent, twice: GBs at 100,000 files
    print()
    print(
        f"{os.cpu_count()} CPUs; {a.files:,} small files ({state / 1e6:.0f} MB); "
        f"medians of {a.repeat}"
    )
    print("| figure | before | after | peer / goal |")
    print("|---|---|---|---|")
    m = {k: {f: med(v) for f, v in r.items()} for k, r in res.items()}
    bw, aw = m["before"]["wall_s"], m["after"]["wall_s"]
    print(
        f"| unchanged move back over SSH: wall | {bw:.2f} s | {aw:.2f} s | "
        f"rsync -a -e ssh {rs['wall_s']:.2f} s; after = {aw / rs['wall_s']:.1f}x (goal <= 2x) |"
    )
    bb, ab = m["before"]["wire"], m["after"]["wire"]
    print(
        f"| unchanged move back over SSH: wire | {bb / 1e6:.2f} MB | {ab / 1e6:.2f} MB | "
        f"rsync {rs['wire_bytes'] / 1e6:.2f} MB; after = {ab / state:.3%} of the state "
        "(goal <= 0.1%) |"
    )
    print(
        f"| unchanged move back: SSH connections accepted | {m['before']['conns']:.0f} | "
        f"{m['after']['conns']:.0f} | |"
    )
    print(
        f"| pause, one file changed | {m['before']['pause_s']:.2f} s | "
        f"{m['after']['pause_s']:.2f} s | goal <= 2 s |"
    )
    print(
        f"| pause, one file changed after the final's inventory (agent paused): pause; "
        f"final's data | {m['before']['late_s']:.2f} s; {m['before']['late_b'] / 1e6:.2f} MB | "
        f"{m['after']['late_s']:.2f} s; {m['after']['late_b'] / 1e6:.3f} MB | goal <= 2 s |"
    )
    print(
        f"| first move (to a box that never held it), pause, one file changed; one run "
        f"each | {first['before']['pause_s']:.2f} s | {first['after']['pause_s']:.2f} s | "
        "goal <= 2 s |"
    )
    print(
        f"| first move: the whole move (bulk while it answers, then the pause) | "
        f"{first['before']['total_s']:.2f} s | {first['after']['total_s']:.2f} s | |"
    )


if __name__ == "__main__":
    main()
