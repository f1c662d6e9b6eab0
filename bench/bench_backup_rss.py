"""Peak memory of lnk's backup and restore beside restic's, on many small files.

The same source-like agent (``bench_backup.source_files``) is backed up (first,
then unchanged) and restored by each lnk tree named with ``--lnk`` (default:
this checkout), and by restic, into fresh local repositories; each command's
wall time and peak RSS (``os.wait4``) is printed.  Several ``--lnk`` trees in
one run compare a change before and after on the same data::

    python bench/bench_backup_rss.py --files 1000000 --restore-to /dev/shm/r
    python bench/bench_backup_rss.py --files 200000 --lnk /tmp/before --lnk .

Tests never time anything; this is not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_backup import MIB, NAME, PASSWORD, Run, run, source_files

from lnk.agents.machine import Machine

GOAL = 200 * MIB


def lnk_rounds(tree: Path, master: Path, work: Path, out: Path) -> dict[str, Run]:
    # the second machine (the restore's) lives on --restore-to whole: its receivers stage
    # beside its agents (one filesystem), and creating a million files where as many were
    # just deleted costs ext4's inode allocator more than the restore itself
    home, home_b, repo = work / "home", out / "home-b", work / "repo"
    for p in (home, home_b, repo):
        shutil.rmtree(p, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    subprocess_cp(master, home)
    repo.mkdir(parents=True)
    home_b.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LNK_")}
    env |= {"PYTHONPATH": str(tree), "LNK_TESTING": "1"}
    # run from the tree: ``python -m`` puts the working folder before PYTHONPATH
    lnk = [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(tree)!r}); from lnk.cli.main import main; main()",
    ]
    to = ["--agent", NAME, "--to", f"file://{repo}"]
    res = {
        "first backup": run([*lnk, "agent", "backup", *to], env=env | {"HOME": str(home)}),
        "unchanged backup": run([*lnk, "agent", "backup", *to], env=env | {"HOME": str(home)}),
    }
    key = run([*lnk, "backup", "key", "export"], env=env | {"HOME": str(home)}).out.encode()
    run([*lnk, "backup", "key", "import"], env=env | {"HOME": str(home_b)}, stdin=key)
    res["restore"] = run(
        [*lnk, "agent", "restore", NAME, "--from", f"file://{repo}"],
        env=env | {"HOME": str(home_b)},
    )
    return res


def restic_rounds(master: Path, work: Path, out: Path) -> dict[str, Run]:
    repo = work / "restic"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, RESTIC_PASSWORD=PASSWORD, RESTIC_CACHE_DIR=str(work / "rc"))
    run(["restic", "-q", "-r", str(repo), "init"], env=env)
    src = str(Machine(master).folders(NAME).root)
    res = {
        "first backup": run(["restic", "-q", "-r", str(repo), "backup", src], env=env),
        "unchanged backup": run(["restic", "-q", "-r", str(repo), "backup", src], env=env),
        "restore": run(
            ["restic", "-q", "-r", str(repo), "restore", "latest", "--target", str(out)], env=env
        ),
    }
    shutil.rmtree(out, ignore_errors=True)
    return res


def subprocess_cp(src: Path, dst: Path) -> None:
    run(["cp", "-a", str(src), str(dst)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--lnk", type=Path, action="append", help="an lnk tree (repeatable)")
    p.add_argument("--no-restic", action="store_true")
    p.add_argument("--dir", type=Path, default=None, help="work folder (kept if given)")
    p.add_argument("--restore-to", type=Path, default=None, help="restores go here (a tmpfs)")
    a = p.parse_args()
    trees = [t.resolve() for t in (a.lnk or [Path(__file__).resolve().parent.parent])]
    top = a.dir or Path(tempfile.mkdtemp(prefix="lnk-bench-rss-"))
    out = a.restore_to or top / "restored"
    try:
        master = top / "master-home"
        if not master.exists():
            print(f"generating {a.files} files ...", file=sys.stderr)
            source_files(master, a.files)
        cols: dict[str, dict[str, Run]] = {}
        for t in trees:
            cols[f"lnk {t.name}"] = lnk_rounds(t, master, top / "w", out)
            shutil.rmtree(top / "w", ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
        if not a.no_restic:
            cols["restic"] = restic_rounds(master, top, out)
        print(
            f"{a.files:,} source-like files; wall s / peak RSS MiB of the largest process "
            "(of all its processes together, sampled) (goal <= 200 MiB)"
        )
        print(f"{'':18}" + "".join(f"{c:>30}" for c in cols))
        for step in ("first backup", "unchanged backup", "restore"):
            cells = "".join(
                f"{cols[c][step].seconds:>12.1f} s {cols[c][step].max_rss / MIB:>5.0f} MiB"
                f" ({cols[c][step].tree_rss / MIB:>4.0f})"
                for c in cols
            )
            print(f"{step:18}{cells}")
    finally:
        if a.dir is None:
            shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
