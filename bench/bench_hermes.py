"""Carrying a Hermes agent: lnk's backup, restore and move beside Hermes's own
``hermes backup -o`` (a zip) + copy + ``hermes import``, on the same agent, same run.

    python bench/bench_hermes.py [--sessions 1000] [--db-mb 50] [--files 100000]

It makes a throwaway HOME with a Hermes agent (lnk-hermes, the real hermes-agent in
LNK_HERMES_VENV, default ~/.cache/lnk/hermes-0.19.0) thinking with tests/servers.py's
ModelServer, runs one real turn (Hermes makes its state.db), then grows it: ``--sessions``
sessions whose messages fill ``--db-mb`` MB of state.db (through SQLite, so Hermes's
full-text indexes hold them), and ``--files`` small files (200-2,000 bytes) in Home/.
Then, each timed alone (wall clock, the agent stopped unless said):

* lnk backup, first (to a file:// bucket); after one new conversation (a real turn);
  lnk restore on a fresh HOME;
* lnk move to a local box and back (the agent running: its bulk while it answers);
* hermes backup -o (Hermes's home: Agent/harness); after the same new conversation;
  copying the zip; hermes import into a fresh home.

Hermes's zip holds its home alone; lnk's backup holds that and Home/ (the person's
files), so the table says both sizes.  Prints one table (Markdown).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
VENV = Path(os.environ.get("LNK_HERMES_VENV") or Path.home() / ".cache/lnk/hermes-0.19.0")
KEY = "sk-bench"


def lnk(home: Path, *args: str) -> str:
    env = dict(os.environ, HOME=str(home), LNK_HERMES_VENV=str(VENV), BENCH_KEY=KEY)
    env["PYTHONPATH"] = str(ROOT)
    # its agents' ports clear of a test suite running beside it (lnk's test offset)
    env |= {"LNK_TESTING": "1", "LNK_TEST_PORT_OFFSET": "7800"}
    r = subprocess.run(
        [sys.executable, "-m", "lnk", *args], env=env, capture_output=True, text=True, timeout=3600
    )
    if r.returncode != 0:
        raise SystemExit(f"lnk {' '.join(args)} failed: {r.stderr}")
    return r.stdout


def hermes(hermes_home: Path, *args: str) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(hermes_home.parent), "LANG": "C.UTF-8"}
    env["HERMES_HOME"] = str(hermes_home)
    r = subprocess.run(
        [str(VENV / "bin" / "hermes"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        stdin=subprocess.DEVNULL,
    )
    if r.returncode != 0:
        raise SystemExit(f"hermes {' '.join(args)} failed: {r.stdout[-500:]} {r.stderr[-500:]}")


def timed(what: Callable[[], object]) -> float:
    t = time.perf_counter()
    what()
    return time.perf_counter() - t


def grow_db(db_path: Path, sessions: int, mb: int) -> None:
    """Sessions, then messages round them as Hermes keeps them, until state.db is ``mb``
    MB (Hermes's triggers index each message for its full-text search)."""
    db = sqlite3.connect(db_path)
    cols = [r[1] for r in db.execute("PRAGMA table_info(sessions)")]
    mcols = [r[1] for r in db.execute("PRAGMA table_info(messages)")]
    rng = random.Random(1)
    words = [f"w{i}" for i in range(5000)]
    now = time.time()

    def insert(table: str, row: dict[str, object], have: list[str]) -> None:
        keys = [k for k in row if k in have]
        marks = ",".join("?" * len(keys))
        db.execute(
            f"INSERT INTO {table} ({','.join(keys)}) VALUES ({marks})", [row[k] for k in keys]
        )

    def size() -> int:
        db.commit()
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        return db_path.stat().st_size

    for s in range(sessions):
        insert("sessions", {"id": f"bench_{s:05d}", "source": "cli", "started_at": now - s}, cols)
    i = 0
    while size() < mb << 20:  # messages round the sessions, 200 between looks at the size
        for _ in range(200):
            msg = {"session_id": f"bench_{i % sessions:05d}", "timestamp": now + i}
            msg |= {"role": "user" if i % 2 == 0 else "assistant"}
            insert("messages", msg | {"content": " ".join(rng.choices(words, k=200))}, mcols)
            i += 1
    db.commit()
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def grow_home(home_dir: Path, files: int) -> None:
    rng = random.Random(2)
    for i in range(files):
        d = home_dir / f"d{i // 1000:03d}"
        if i % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:06d}.txt").write_bytes(rng.randbytes(rng.randint(200, 2000)))


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--db-mb", type=int, default=50)
    ap.add_argument("--files", type=int, default=100_000)
    a = ap.parse_args()
    from servers import ModelServer

    base = Path(tempfile.mkdtemp(prefix="lnk-bench-hermes-"))
    here, fresh, box = base / "here", base / "fresh", base / "box"
    for d in (here, fresh, box):
        d.mkdir()
    model = ModelServer("bench")
    try:
        lnk(here, "agent", "create", "work", "--harness", "hermes", "--model", "test-model",
            "--model-url", model.base_url, "--key-env", "BENCH_KEY")  # fmt: skip
        lnk(here, "agent", "allow", "--agent", "work", "--port", str(model.port))
        lnk(here, "agent", "start", "--agent", "work")
        lnk(here, "agent", "chat", "send", "--agent", "work", "first")
        lnk(here, "agent", "stop", "--agent", "work")
        folder = here / "Link" / "Agents" / "work"
        hh = folder / "Agent" / "harness"
        grow_db(hh / "state.db", a.sessions, a.db_mb)
        grow_home(folder / "Home", a.files)
        bucket = base / "bucket"
        bucket.mkdir()
        url = f"file://{bucket}"
        res: dict[str, float] = {}
        zips = base / "zips"
        zips.mkdir()
        res["hermes backup -o (first)"] = timed(
            lambda: hermes(hh, "backup", "-o", str(zips / "1.zip"))
        )
        res["lnk backup (first)"] = timed(
            lambda: lnk(here, "agent", "backup", "--agent", "work", "--to", url)
        )
        # one new conversation: a real Hermes turn
        lnk(here, "agent", "start", "--agent", "work")
        lnk(here, "agent", "chat", "send", "--agent", "work", "a new conversation")
        lnk(here, "agent", "stop", "--agent", "work")
        res["hermes backup -o (after one conversation)"] = timed(
            lambda: hermes(hh, "backup", "-o", str(zips / "2.zip"))
        )
        res["lnk backup (after one conversation)"] = timed(
            lambda: lnk(here, "agent", "backup", "--agent", "work", "--to", url)
        )
        other = base / "other"
        other.mkdir()
        res["copy the zip"] = timed(lambda: shutil.copy(zips / "2.zip", other / "2.zip"))
        target = base / "import-home" / "harness"
        target.mkdir(parents=True)
        res["hermes import"] = timed(
            lambda: hermes(target, "import", str(other / "2.zip"), "--force")
        )
        key = lnk(here, "backup", "key", "export")
        env = dict(os.environ, HOME=str(fresh), PYTHONPATH=str(ROOT))
        subprocess.run([sys.executable, "-m", "lnk", "backup", "key", "import"], input=key,
                       text=True, env=env, check=True, capture_output=True)  # fmt: skip
        res["lnk restore (fresh machine)"] = timed(
            lambda: lnk(fresh, "agent", "restore", "work", "--from", url)
        )
        lnk(here, "box", "add", "b1", "--local", str(box))
        lnk(here, "agent", "start", "--agent", "work")
        res["lnk move here -> box (running)"] = timed(
            lambda: lnk(here, "agent", "move", "--agent", "work", "--to", "b1")
        )
        res["lnk move box -> here (running)"] = timed(
            lambda: lnk(here, "agent", "move", "--agent", "work", "--here")
        )
        lnk(here, "agent", "stop", "--agent", "work")
        sizes = {
            "state.db": (hh / "state.db").stat().st_size,
            "Hermes's home (Agent/harness)": size_of(hh),
            "Home/": size_of(folder / "Home"),
            "the zip": (zips / "2.zip").stat().st_size,
            "lnk's bucket (2 backups)": size_of(bucket),
        }
        print(f"\n{a.sessions} sessions, {a.db_mb} MB state.db, {a.files} small files in Home/\n")
        print("| step | seconds |\n|---|---|")
        for k, v in res.items():
            print(f"| {k} | {v:.2f} |")
        print("\n| size | MB |\n|---|---|")
        for k, v in sizes.items():
            print(f"| {k} | {v / 1e6:.1f} |")
    finally:
        model.stop()
        from tests.move.move_helpers import kill_agents

        kill_agents([here, fresh, box])  # by their pidfiles: any runner left by a failure
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
