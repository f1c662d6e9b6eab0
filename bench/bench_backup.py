"""``lnk agent backup`` / ``lnk agent restore`` beside restic and borg, on the same agent.

Generates one agent with bench/gen_agent.py (75% incompressible files of mixed
sizes, 25% JSON-like conversations: half ``.jsonl`` files, half events in the
agent's store), then, for each of ``--repeat`` rounds and for each tool, into a
fresh local repository:

1. first backup of the agent's folder (lnk: ``lnk agent backup --to file:///...``;
   restic: ``restic -r DIR backup PATH``; borg: ``borg create DIR::a PATH``);
2. change 1% of the data (new incompressible files, one file rewritten, events
   appended to a conversation, lines appended to a ``.jsonl`` note), then an
   incremental backup; bytes uploaded = growth of the repository folder;
3. full restore of the newest snapshot into a fresh folder (lnk: a second HOME
   after ``lnk backup key import``; ``restic restore latest --target``;
   ``borg extract``).

Settings, all three encrypted and compressed: lnk as shipped (AES-256-GCM,
zstd level 3, 1 MiB chunks); restic 0.14 repository v2 (AES-256-CTR + Poly1305,
compression ``auto``); borg 1.2 ``init -e repokey`` (AES-256-CTR + HMAC-SHA256)
with ``--compression zstd,3``: the same codec and level as lnk, so the bytes
uploaded are comparable (lz4 would be faster to compress but bigger).
Repository init (restic, borg) is not timed; lnk makes its repository in its
first backup, which is timed.

Peak memory is the max RSS of the process and its waited-for children
(``os.wait4``'s rusage around each subprocess).  Page caches are kept warm by
default (the agent is read once before the first round; other benches may share
the machine); ``--cold`` drops them (``echo 3 > /proc/sys/vm/drop_caches``)
before each timed command, and ignores a failure to.

    python bench/bench_backup.py --quick       # 200 MiB smoke run
    python bench/bench_backup.py               # 1 GiB, 3 rounds
    python bench/bench_backup.py --size 4 --repeat 1 --keep
    python bench/bench_backup.py --files 100000 --repeat 1   # source-like small files

``--files N`` backs up N source-like text files of 100 B - 16 KiB instead (each
unique, compressible, in folders of 500), and the second backup changes nothing
(target: at most half restic's time); a third backup, unchanged again, times
each tool's steady state (lnk's second is the first after a first backup, which
had made no cache of folder digests yet).

Every figure is the median of the rounds.  Tests never time anything; this is
not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

HERE_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE_DIR))

from gen_agent import GIB, MIB, Chatter, RandomBytes, generate  # noqa: E402

from lnk.agents import registry  # noqa: E402
from lnk.agents.layout import Machine  # noqa: E402
from lnk.agents.stores import open_agent_store  # noqa: E402
from lnk.collections import CollectionId  # noqa: E402

NAME = "bench"
PASSWORD = "bench-backup-password"
TOOLS = ("lnk", "restic", "borg")
MEM_CAP = 200 * MIB


# ---- running and measuring ---------------------------------------------------
@dataclass
class Run:
    seconds: float
    max_rss: int  # bytes
    out: str
    cpu: float = 0.0  # user + system seconds of the tree
    tree_rss: int = 0  # bytes: the largest sum of the RSS of the command and its
    # descendants, sampled every 50 ms (lnk's backup and restore run a second process;
    # ``max_rss`` is the largest single process)


SETTLE = 10.0  # seconds to let the disk finish earlier writes and deletions


def settle() -> None:
    """Flush, then wait: on this kind of disk (ext4 with online discard) the deletion of
    a round's 100,000 files or a tool's writes go on in the kernel for seconds and slow
    whichever command runs next (measured: a restore took 9.4 s settled, 17-26 s right
    after).  Every tool's backup and restore starts from a settled disk."""
    os.sync()
    time.sleep(SETTLE)


def drop_caches(cold: bool) -> None:
    if not cold:
        return
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass


def run(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: bytes | None = None,
    cold: bool = False,
    settled: bool = False,
) -> Run:
    """Run a command to completion; wall seconds and the tree's peak RSS."""
    if settled:
        settle()
    drop_caches(cold)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(
            list(argv),
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=err,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        )
        sampler = TreeRss(p.pid)
        if stdin is not None:
            assert p.stdin is not None
            p.stdin.write(stdin)
            p.stdin.close()
        _pid, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        sampler.stop()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text = out.read().decode(errors="replace")
        if p.returncode:
            raise RuntimeError(
                f"{' '.join(argv)} -> {p.returncode}:\n"
                f"{err.read().decode(errors='replace')[-3000:]}"
            )
    rss = usage.ru_maxrss * 1024
    return Run(dt, rss, text, usage.ru_utime + usage.ru_stime, max(rss, sampler.peak))


class TreeRss:
    """The largest sum of RSS over a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.pid, self.every, self.peak = pid, every, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._done.wait(self.every):
            parents: dict[int, int] = {}
            rss: dict[int, int] = {}
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[1].split()
                except OSError:
                    continue
                parents[int(entry.name)] = int(fields[1])
                rss[int(entry.name)] = int(fields[21]) * page
            tree, grew = {self.pid}, True
            while grew:
                more = {p for p, pp in parents.items() if pp in tree} - tree
                tree |= more
                grew = bool(more)
            self.peak = max(self.peak, sum(rss.get(p, 0) for p in tree))


def tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for nm in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(dirpath, nm)).st_size
    return total


def read_all(root: Path) -> None:
    """Warm the page cache with every file under ``root``."""
    for dirpath, _dirs, names in os.walk(root):
        for nm in names:
            with open(os.path.join(dirpath, nm), "rb", buffering=0) as f:
                while f.read(4 * MIB):
                    pass


# ---- the 1% change ------------------------------------------------------------
def change(home: Path, budget: int, seed: int) -> int:
    """Change about ``budget`` bytes of the agent; the changed bytes after zstd -3.

    40% new incompressible files, 20% one existing data file rewritten with new
    bytes, 20% events appended to a conversation in the store, 20% lines appended
    to a .jsonl note."""
    a = registry.find(Machine(home), NAME)
    rb = RandomBytes(seed, "change")
    cz = zstandard.ZstdCompressor(level=3)
    changed = 0
    d = a.folders.home / "changed"
    d.mkdir(parents=True, exist_ok=True)
    new = int(budget * 0.4)
    i = 0
    while new > 0:
        n = min(new, 2 * MIB)
        (d / f"new-{seed}-{i}.bin").write_bytes(rb.take(n))
        changed += n
        new -= n
        i += 1
    # rewrite the data file closest in size to 20% of the budget
    want = int(budget * 0.2)
    files = sorted(
        (a.folders.home / "data").rglob("*.bin"), key=lambda p: abs(p.stat().st_size - want)
    )
    victim = files[0]
    size = victim.stat().st_size
    with open(victim, "wb") as f:
        left = size
        while left:
            n = min(left, 4 * MIB)
            f.write(rb.take(n))
            left -= n
    changed += size
    chatter = Chatter(seed)
    store = open_agent_store(a.folders.chats, a.settings.store, a.settings.lapse_s)
    try:
        cid = CollectionId("events", "link:conv-0001")
        n0 = store.last_number(cid) + 1
        evs: list[dict[str, Any]] = []
        text = bytearray()
        while len(text) < int(budget * 0.2):
            ev = chatter.event(1, n0 + len(evs))
            evs.append(ev)
            text += json.dumps(ev, separators=(",", ":")).encode() + b"\n"
        store.append_many(cid, n0, evs)
        changed += len(cz.compress(bytes(text)))
    finally:
        store.close()
    notes = sorted((a.folders.home / "notes").glob("*.jsonl"))
    text = bytearray()
    k = 0
    while len(text) < int(budget * 0.2):
        text += json.dumps(chatter.event(2, 10**6 + k), separators=(",", ":")).encode() + b"\n"
        k += 1
    with open(notes[len(notes) // 2], "ab") as f:
        f.write(text)
    changed += len(cz.compress(bytes(text)))
    return changed


# ---- the three tools -----------------------------------------------------------
@dataclass
class Result:
    first_s: float = 0.0
    first_rss: int = 0
    first_bytes: int = 0
    incr_s: float = 0.0
    incr_rss: int = 0
    incr_bytes: int = 0
    restore_s: float = 0.0
    restore_rss: int = 0
    restored_bytes: int = 0
    first_cpu: float = 0.0
    incr_cpu: float = 0.0
    restore_cpu: float = 0.0
    again_s: float = 0.0  # --files: a third backup, unchanged again (the steady state)
    again_cpu: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        return max(self.first_rss, self.incr_rss, self.restore_rss)


class Round:
    """One round: a fresh copy of the agent, fresh repositories, fresh restore folders."""

    def __init__(
        self, work: Path, master: Path, cold: bool, seed: int, out: Path | None = None
    ) -> None:
        self.work = work
        self.out = out or work  # where restores write (see --restore-to)
        self.cold = cold
        self.seed = seed
        self.home = work / "home"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        # a copy, so every round starts from the same unchanged agent
        subprocess.run(["cp", "-a", str(master), str(self.home)], check=True)
        self.root = Machine(self.home).folders(NAME).root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LNK_")}
        self.env |= {
            "HOME": str(self.home),
            "RESTIC_PASSWORD": PASSWORD,
            "BORG_PASSPHRASE": PASSWORD,
            "RESTIC_CACHE_DIR": str(work / "restic-cache"),
            "BORG_BASE_DIR": str(work / "borg-base"),
            "LNK_TESTING": "1",
        }

    def lnk(
        self, *args: str, home: Path | None = None, stdin: bytes | None = None, timed: bool = True
    ) -> Run:
        env = self.env | {"HOME": str(home or self.home)}
        return run(
            [sys.executable, "-m", "lnk", *args],
            env=env,
            stdin=stdin,
            cold=self.cold and timed,
            settled=timed,
        )

    def tool(self, argv: Sequence[str], cwd: Path | None = None) -> Run:
        return run(argv, env=self.env, cwd=cwd, cold=self.cold, settled=True)

    def backups(self, budget: int) -> tuple[dict[str, Result], int]:
        res = {t: Result() for t in TOOLS}
        repos = {t: self.work / f"repo-{t}" for t in TOOLS}
        repos["lnk"].mkdir()
        run(["restic", "-q", "-r", str(repos["restic"]), "init"], env=self.env)
        run(["borg", "init", "-e", "repokey", str(repos["borg"])], env=self.env)
        cmds = {
            "lnk": lambda: self.lnk(
                "agent", "backup", "--agent", NAME, "--to", f"file://{repos['lnk']}"
            ),
            "restic": lambda: self.tool(
                ["restic", "-q", "-r", str(repos["restic"]), "backup", str(self.root)]
            ),
            "borg": lambda: self.tool(
                [
                    "borg",
                    "create",
                    "--compression",
                    "zstd,3",
                    f"{repos['borg']}::snap{len(self._borg)}",
                    str(self.root),
                ]
            ),
        }
        self._borg: list[int] = []
        changed = 0
        # unchanged source-like files: a third backup times each tool's steady state (the
        # second is the first after a first backup, which made no cache of folders yet)
        phases = ("first", "incr") if budget else ("first", "incr", "again")
        for phase in phases:
            if phase == "incr" and budget:
                changed = change(self.home, budget, self.seed)
            for t in TOOLS:
                before = tree_size(repos[t])
                r = cmds[t]()
                if t == "borg":
                    self._borg.append(1)
                grown = tree_size(repos[t]) - before
                setattr(res[t], f"{phase}_s", r.seconds)
                setattr(res[t], f"{phase}_cpu", r.cpu)
                if phase != "again":
                    setattr(res[t], f"{phase}_rss", r.max_rss)
                    setattr(res[t], f"{phase}_bytes", grown)
        self.repos = repos
        return res, changed

    def restores(self, res: dict[str, Result]) -> None:
        repos = self.repos
        for old in ("home-b", "restic-out", "borg-out"):
            shutil.rmtree(self.out / old, ignore_errors=True)
        home_b = self.out / "home-b"
        home_b.mkdir(parents=True)
        key = self.lnk("backup", "key", "export", timed=False).out.encode()
        self.lnk("backup", "key", "import", home=home_b, stdin=key, timed=False)
        r = self.lnk("agent", "restore", NAME, "--from", f"file://{repos['lnk']}", home=home_b)
        res["lnk"].restore_s, res["lnk"].restore_rss = r.seconds, r.max_rss
        res["lnk"].restore_cpu = r.cpu
        res["lnk"].restored_bytes = tree_size(Machine(home_b).folders(NAME).root)
        dest = self.out / "restic-out"
        r = self.tool(
            ["restic", "-q", "-r", str(repos["restic"]), "restore", "latest", "--target", str(dest)]
        )
        res["restic"].restore_s, res["restic"].restore_rss = r.seconds, r.max_rss
        res["restic"].restore_cpu = r.cpu
        res["restic"].restored_bytes = tree_size(dest)
        dest = self.out / "borg-out"
        dest.mkdir()
        r = self.tool(["borg", "extract", f"{repos['borg']}::snap1"], cwd=dest)
        res["borg"].restore_s, res["borg"].restore_rss = r.seconds, r.max_rss
        res["borg"].restore_cpu = r.cpu
        res["borg"].restored_bytes = tree_size(dest)


# ---- the table -------------------------------------------------------------------
def med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def source_files(home: Path, count: int, seed: int = 1) -> None:
    """An agent whose Home holds ``count`` source-like files of 100 B - 16 KiB."""
    import random

    rnd = random.Random(seed)
    words = [
        "def",
        "return",
        "import",
        "class",
        "self",
        "value",
        "data",
        "list",
        "dict",
        "for",
        "in",
        "if",
        "else",
        "while",
        "None",
        "True",
        "False",
        "lambda",
        "yield",
        "async",
        "await",
        "with",
        "as",
        "try",
        "except",
        "raise",
        "print",
        "len",
        "range",
    ]
    lines = []
    for _ in range(20000):
        ind = "    " * rnd.randrange(0, 4)
        body = " ".join(rnd.choice(words) for _ in range(rnd.randrange(2, 12)))
        lines.append(f"{ind}{body}  # {rnd.randrange(10**6)}\n")
    corpus = "".join(lines).encode()
    a = registry.create(Machine(home), NAME)
    root = a.folders.home / "src"
    for i in range(count):
        d = root / f"p{i // 500:04d}"
        if i % 500 == 0:
            d.mkdir(parents=True, exist_ok=True)
        size = rnd.randrange(100, 16 * 1024)
        off = rnd.randrange(0, len(corpus) - size)
        head = f"# module {i} {rnd.getrandbits(64):016x}\n".encode()
        (d / f"m{i:06d}.py").write_bytes((head + corpus[off : off + size])[:size])


def table(rounds: list[dict[str, Result]], changed: int, state: int, files: int = 0) -> str:
    def m(tool: str, attr: str) -> float:
        return med([getattr(r[tool], attr) for r in rounds])

    rows: list[tuple[str, ...]] = []
    f = {t: m(t, "first_s") for t in TOOLS}
    i = {t: m(t, "incr_s") for t in TOOLS}
    rs = {t: m(t, "restore_s") for t in TOOLS}
    ib = {t: m(t, "incr_bytes") for t in TOOLS}
    pk = {t: med([r[t].peak for r in rounds]) for t in TOOLS}
    rows.append(
        (
            "first backup (s)",
            *(f"{f[t]:.2f}" for t in TOOLS),
            f"<= restic = {f['restic']:.2f}"
            if files
            else f"<= min(restic, borg) = {min(f['restic'], f['borg']):.2f}",
            verdict(f["lnk"] <= (f["restic"] if files else min(f["restic"], f["borg"]))),
        )
    )
    rows.append(("  uploaded", *(mb(m(t, "first_bytes")) for t in TOOLS), "", ""))
    rows.append(
        (
            "second backup, unchanged (s)",
            *(f"{i[t]:.2f}" for t in TOOLS),
            f"<= 0.5 x restic = {0.5 * i['restic']:.2f}",
            verdict(i["lnk"] <= 0.5 * i["restic"]),
        )
        if files
        else (
            "incremental, 1% changed (s)",
            *(f"{i[t]:.2f}" for t in TOOLS),
            f"<= restic = {i['restic']:.2f} (aim borg {i['borg']:.2f})",
            verdict(i["lnk"] <= i["restic"]),
        )
    )
    rows.append(
        (
            "  uploaded",
            *(mb(ib[t]) for t in TOOLS),
            "one small snapshot, < 64 KiB"
            if files
            else f"<= 1.2 x {mb(changed)} = {mb(1.2 * changed)}",
            verdict(ib["lnk"] < 64 * 1024 if files else ib["lnk"] <= 1.2 * changed),
        )
    )
    if files:
        a = {t: m(t, "again_s") for t in TOOLS}
        rows.append(
            (
                "third backup, unchanged (s)",
                *(f"{a[t]:.2f}" for t in TOOLS),
                f"<= 0.5 x restic = {0.5 * a['restic']:.2f}",
                verdict(a["lnk"] <= 0.5 * a["restic"]),
            )
        )
    rows.append(
        (
            "full restore (s)",
            *(f"{rs[t]:.2f}" for t in TOOLS),
            f"<= restic = {rs['restic']:.2f}",
            verdict(rs["lnk"] <= rs["restic"]),
        )
    )
    rows.append(("  restored", *(mb(m(t, "restored_bytes")) for t in TOOLS), "", ""))
    for label, attr in (
        ("peak RSS, first (MiB)", "first_rss"),
        ("peak RSS, incremental (MiB)", "incr_rss"),
        ("peak RSS, restore (MiB)", "restore_rss"),
    ):
        rows.append((label, *(f"{m(t, attr) / MIB:.0f}" for t in TOOLS), "", ""))
    rows.append(
        (
            "peak RSS, all (MiB)",
            *(f"{pk[t] / MIB:.0f}" for t in TOOLS),
            f"<= restic = {pk['restic'] / MIB:.0f} and <= 200",
            verdict(pk["lnk"] <= pk["restic"] and pk["lnk"] <= MEM_CAP),
        )
    )
    for label, attr in (
        ("CPU s (user+sys), first", "first_cpu"),
        ("CPU s, incremental", "incr_cpu"),
        ("CPU s, restore", "restore_cpu"),
    ):
        rows.append((label, *(f"{m(t, attr):.2f}" for t in TOOLS), "", ""))
    head = ("", "lnk", "restic", "borg", "target", "")
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(6)]
    lines = [
        f"state {mb(state)}, {len(rounds)} round(s), medians; changed bytes after "
        f"zstd -3: {mb(changed)}"
    ]
    for r in [head, *rows]:
        lines.append(
            "  ".join(
                c.ljust(w) if k in (0, 4) else c.rjust(w) if k < 4 else c
                for k, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=float, default=1.0, help="GiB of agent state (default 1)")
    p.add_argument("--quick", action="store_true", help="a 200 MiB smoke run, one round")
    p.add_argument("--repeat", type=int, default=None, help="rounds (default 3; 1 with --quick)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--cold", action="store_true", help="drop page caches before each command")
    p.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="also print every round as JSON")
    p.add_argument("--files", type=int, default=0, help="N source-like small files instead")
    p.add_argument(
        "--restore-to",
        type=Path,
        default=None,
        help="restore into this folder (e.g. a tmpfs): on ext4, creating 100,000 files "
        "where as many were deleted shortly before costs the kernel's inode allocator "
        "20 s and more (recently_deleted(), measured with perf), whichever tool comes first",
    )
    a = p.parse_args(argv)
    size = 200 * MIB if a.quick else int(a.size * GIB)
    repeat = a.repeat or (1 if a.quick else 3)
    for tool in ("restic", "borg"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed")
    top = a.dir or Path(tempfile.mkdtemp(prefix="lnk-bench-backup-"))
    top.mkdir(parents=True, exist_ok=True)
    try:
        master = top / "master-home"
        if not master.exists():
            if a.files:
                print(f"generating {a.files} source files in {master} ...", file=sys.stderr)
                source_files(master, a.files)
            else:
                print(f"generating {mb(size)} in {master} ...", file=sys.stderr)
                generate(master, size, name=NAME)
        state = tree_size(Machine(master).folders(NAME).root)
        rounds: list[dict[str, Result]] = []
        changed = 0
        for k in range(repeat):
            rnd = Round(top / "round", master, a.cold, seed=100 + k, out=a.restore_to)
            if not a.cold:
                read_all(rnd.root)
            res, changed = rnd.backups(0 if a.files else size // 100)
            rnd.restores(res)
            rounds.append(res)
            print(
                f"round {k + 1}/{repeat}: "
                + ", ".join(
                    f"{t} {r.first_s:.2f}/{r.incr_s:.2f}/{r.restore_s:.2f}s "
                    f"{r.peak / MIB:.0f}MiB {mb(r.incr_bytes)}"
                    for t, r in res.items()
                ),
                file=sys.stderr,
            )
            if a.json:
                print(json.dumps({t: vars(r) for t, r in res.items()}), file=sys.stderr)
        print(table(rounds, changed, state, a.files))
    finally:
        if not a.keep:
            shutil.rmtree(top, ignore_errors=True)
        else:
            print(f"kept {top}", file=sys.stderr)


if __name__ == "__main__":
    main()
