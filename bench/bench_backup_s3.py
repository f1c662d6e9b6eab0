"""``lnk agent backup`` / ``restore`` to S3 on loopback (Ceph radosgw), beside restic to
the same server, on the same agent, in the same run.

Starts the one-node radosgw the tests use (tests/servers.py: one mon, one memstore OSD,
on free loopback ports), makes one bucket per tool, then times, as real processes:

1. first backup (lnk: ``lnk agent backup --to s3://BUCKET/agents``; restic:
   ``restic -r s3:ENDPOINT/BUCKET backup PATH`` after an untimed ``init``);
2. a second backup with nothing changed;
3. a full restore (lnk on a second HOME after ``lnk backup key import``; restic
   ``restore latest --target``).

    python bench/bench_backup_s3.py --files 100000     # source-like small files
    python bench/bench_backup_s3.py --size 1           # the 1 GiB mixed agent

Needs the Debian packages radosgw, ceph-mon, ceph-osd and restic.  Not a test: tests
never time anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from bench_backup import NAME, PASSWORD, Run, source_files, tree_size  # noqa: E402
from bench_backup import run as timed  # noqa: E402
from gen_agent import GIB, MIB, generate  # noqa: E402
from servers import RadosGateway  # noqa: E402

from lnk.agents.layout import Machine  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, default=0, help="N source-like small files")
    p.add_argument("--size", type=float, default=1.0, help="else GiB of the mixed agent")
    p.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    p.add_argument(
        "--restore-to", type=Path, default=None, help="restore here (a tmpfs: see bench_backup)"
    )
    a = p.parse_args(argv)
    top = a.dir or Path(tempfile.mkdtemp(prefix="lnk-bench-s3-"))
    top.mkdir(parents=True, exist_ok=True)
    master = top / "master-home"
    if not master.exists():
        if a.files:
            source_files(master, a.files)
        else:
            generate(master, int(a.size * GIB), name=NAME)
    work = top / "round"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    dest = a.restore_to or work
    for old in ("home-b", "restic-out"):
        shutil.rmtree(dest / old, ignore_errors=True)
    home, home_b, out = work / "home", dest / "home-b", dest / "restic-out"
    subprocess.run(["cp", "-a", str(master), str(home)], check=True)
    home_b.mkdir(parents=True)
    root = Machine(home).folders(NAME).root
    rgw = RadosGateway(str(work / "ceph"))
    try:
        s3 = rgw.client()
        for b in ("lnk-bench", "restic-bench"):
            s3.create_bucket(Bucket=b)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LNK_", "AWS_"))}
        env |= {
            "AWS_ENDPOINT_URL": rgw.endpoint,
            "AWS_ACCESS_KEY_ID": rgw.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": rgw.SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "RESTIC_PASSWORD": PASSWORD,
            "RESTIC_CACHE_DIR": str(work / "restic-cache"),
            "LNK_TESTING": "1",
        }
        url = "s3://lnk-bench/agents"
        repo = f"s3:{rgw.endpoint}/restic-bench"

        def lnk(*args: str, at: Path = home, stdin: bytes | None = None) -> Run:
            return timed(
                [sys.executable, "-m", "lnk", *args],
                env=env | {"HOME": str(at)},
                stdin=stdin,
                settled=True,
            )

        def restic(*args: str) -> Run:
            return timed(["restic", "-q", "-r", repo, *args], env=env, settled=True)

        restic("init")
        rows: dict[str, dict[str, Run]] = {"lnk": {}, "restic": {}}
        for phase in ("first", "unchanged"):
            rows["lnk"][phase] = lnk("agent", "backup", "--agent", NAME, "--to", url)
            rows["restic"][phase] = restic("backup", str(root))
        key = lnk("backup", "key", "export").out.encode()
        lnk("backup", "key", "import", at=home_b, stdin=key)
        rows["lnk"]["restore"] = lnk("agent", "restore", NAME, "--from", url, at=home_b)
        rows["restic"]["restore"] = restic("restore", "latest", "--target", str(out))
        restored = tree_size(Machine(home_b).folders(NAME).root)
        state = tree_size(root)
        print(
            f"S3 on loopback (radosgw {rgw.endpoint}), state {state / 1e6:.1f} MB, "
            f"restored by lnk {restored / 1e6:.1f} MB"
        )
        print(f"{'':<26}{'lnk':>9}{'restic':>9}  target")
        for phase, target in (
            ("first", "<= restic"),
            ("unchanged", "<= 0.5 x restic"),
            ("restore", "<= restic"),
        ):
            ln, rs = rows["lnk"][phase], rows["restic"][phase]
            limit = 0.5 if phase == "unchanged" else 1.0
            ok = ln.seconds <= limit * rs.seconds
            print(
                f"{phase + ' (s)':<26}{ln.seconds:>9.2f}{rs.seconds:>9.2f}  "
                f"{target}: {'PASS' if ok else 'FAIL'}"
            )
            print(f"{'  peak RSS (MiB)':<26}{ln.max_rss / MIB:>9.0f}{rs.max_rss / MIB:>9.0f}")
    finally:
        rgw.stop()
        if a.dir is None:
            shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
