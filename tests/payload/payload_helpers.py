"""Shared helpers for the agent stream engine's tests.

Machines are HOME folders under a test's tmp dir (``Machine(tmp / "a")``).
Agents are made through the registry, filled with files, hard links, symlinks
and collections, sent with ``send_agent`` into a BytesIO or a file and
received with ``receive``.  Hostile payloads are sealed with the real
``StreamWriter`` from hand-made records (``seal``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.agents.settings import Settings
from lnk.agents.stores import open_agent_store
from lnk.collections import CollectionId
from lnk.formats.keys import PublicKey
from lnk.formats.stream import RECORD_MAX, StreamWriter
from lnk.payload import manifest as M
from lnk.payload import receivers
from lnk.payload.folders import sending_digests
from lnk.payload.inventory import Inventory
from lnk.payload.receive import ReceiveReport, receive
from lnk.payload.send import send_agent
from lnk.payload.send_files import SendReport
from lnk.payload.walk import FILE_ROOTS

EVENTS = CollectionId("events", "link:main")
NOTES = CollectionId("notes", "link:main")
JOBS = CollectionId("jobs", "link:main")
TOOLS = CollectionId("tools", "link:main")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- agents -------------------------------------------------------------------
def make_agent(
    machine: Machine,
    name: str = "work",
    *,
    store: str = "files",
    agent_id: str | None = None,
    owner: str | None = None,
) -> Agent:
    return registry.create(machine, name, store=store, agent_id=agent_id, owner=owner)


def write(path: Path, data: bytes, mode: int | None = None, mtime_ns: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mode is not None:
        os.chmod(path, mode)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def fill_collections(agent: Agent, events: int = 3, notes: dict[str, Any] | None = None) -> None:
    """Events in link:main, plus a note, a job and a narrowed tool list."""
    s = open_agent_store(agent.folders.chats, agent.settings.store)
    try:
        last = s.last_number(EVENTS)
        for i in range(events):
            assert s.append(EVENTS, last + i + 1, {"role": "user", "text": f"message {last + i}"})
        for k, v in (notes or {"plan": {"text": "ship it"}}).items():
            s.put(NOTES, k, v)
        s.put(JOBS, "daily", {"cron": "0 9 * * *", "prompt": "summarise"})
        s.put(TOOLS, "allowed", {"tools": ["read", "write"]})
    finally:
        s.close()


def sample_agent(machine: Machine, name: str = "work", store: str = "files") -> Agent:
    """An agent with files, a folder, a hard link, a symlink and collections."""
    a = make_agent(machine, name, store=store)
    h = a.folders.home
    write(h / "docs" / "report.txt", b"the report\n", 0o640, 1_600_000_000_123_456_789)
    write(h / "empty", b"", 0o600)
    write(h / "run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    os.link(h / "docs" / "report.txt", h / "report-link.txt")
    os.symlink("/etc/passwd", h / "passwd")
    write(a.folders.agent / "memory" / "facts.md", b"water is wet\n")
    fill_collections(a)
    return a


# ---- send and receive -----------------------------------------------------------
def prepare(machine: Machine, agent_id: str | None = None) -> receivers.Receiver:
    return receivers.prepare(machine, agent_id)


def public(r: receivers.Receiver) -> PublicKey:
    return r.key().public


def send_bytes(agent: Agent, r: receivers.Receiver, **kw: Any) -> tuple[bytes, SendReport]:
    buf = io.BytesIO()
    rep = send_agent(agent, buf, public(r), **kw)
    return buf.getvalue(), rep


def receive_bytes(machine: Machine, r: receivers.Receiver, data: bytes, **kw: Any) -> ReceiveReport:
    return receive(machine, r.rid, io.BytesIO(data), **kw)


def move(
    agent: Agent,
    dest: Machine,
    *,
    agent_id: str | None = None,
    inventory: bool = False,
    against: bool = False,
    **kw: Any,
) -> tuple[SendReport, ReceiveReport]:
    """prepare | send | receive through a temp file next to the destination; with
    ``against``, the inventory is taken against the agent's folder digests (a move's)."""
    r = prepare(dest, agent_id)
    theirs = (
        sending_digests(agent.folders.root, agent.runtime / "hashes.sqlite") if against else None
    )
    inv = r.inventory(theirs) if inventory else None
    path = dest.home.parent / f"stream-{r.rid}"
    with open(path, "wb") as f:
        srep = send_agent(agent, f, public(r), inventory=inv)
    try:
        with open(path, "rb") as f:
            rrep = receive(dest, r.rid, f, **kw)
    finally:
        path.unlink()
    return srep, rrep


# ---- looking at results -----------------------------------------------------------
def tree(root: Path, skip: Iterable[str] = ()) -> dict[str, tuple[Any, ...]]:
    """Every path under root: kind, mode and content (or link target); never follows links."""
    out: dict[str, tuple[Any, ...]] = {}
    skip = tuple(skip)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if any(rel == s or rel.startswith(s + "/") for s in skip):
                continue
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", mode)
            else:
                out[rel] = ("f", mode, st.st_mtime_ns, sha(p.read_bytes()))
    return out


def machine_tree(m: Machine) -> dict[str, tuple[Any, ...]]:
    """A machine's HOME, but for the receivers' own folders (their staging)."""
    return tree(m.home, skip=[".lnk/receivers"])


def agent_files(agent_root: Path) -> dict[str, tuple[Any, ...]]:
    """What of an agent's folders travels as files: kind, mode, size, sha, mtime."""
    out: dict[str, tuple[Any, ...]] = {}
    for r in FILE_ROOTS:
        top = agent_root / r
        if not top.is_dir():
            continue
        for rel, v in tree(top).items():
            out[f"{r}/{rel}"] = v
    return out


def link_groups(agent_root: Path) -> set[frozenset[str]]:
    """Paths that share an inode (groups of two or more)."""
    by_ino: dict[tuple[int, int], set[str]] = {}
    for r in FILE_ROOTS:
        top = agent_root / r
        for p in top.rglob("*") if top.is_dir() else ():
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                by_ino.setdefault((st.st_dev, st.st_ino), set()).add(str(p.relative_to(agent_root)))
    return {frozenset(g) for g in by_ino.values() if len(g) > 1}


def collections_of(agent: Agent, driver: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every collection as its exported records, read through the collection interface."""
    s = open_agent_store(agent.folders.chats, driver or agent.settings.store)
    try:
        return {f"{c.kind}/{c.name}": list(s.export(c)) for c in s.collections()}
    finally:
        s.close()


def load_agent(machine: Machine, name: str = "work") -> Agent:
    return registry.find(machine, name)


# ---- hand-made payloads --------------------------------------------------------------
def head(
    agent_id: str,
    owner: str,
    name: str = "work",
    *,
    grants: str = "",
    phase: str = "full",
    settings: dict[str, Any] | None = None,
    base_stream: str | None = None,
) -> dict[str, Any]:
    if settings is None:
        settings = Settings(id=agent_id, name=name, owner=owner).to_toml()
    return M.Head(agent_id, owner, name, settings, grants, phase, base_stream).to_json()


def fentry(
    path: str,
    data: bytes | None = None,
    *,
    mode: int = 0o644,
    sha256: str | None = None,
    size: int | None = None,
    carry: bool | None = None,
    group: int | None = None,
    mtime_ns: int = 1_700_000_000_000_000_000,
) -> dict[str, Any]:
    body = data or b""
    d: dict[str, Any] = {
        "p": path,
        "t": "f",
        "m": mode,
        "s": len(body) if size is None else size,
        "h": sha256 or sha(body),
        "d": bool(body) if carry is None else carry,
        "mt": mtime_ns,
    }
    if group is not None:
        d["g"] = group
    return d


def dentry(path: str, mode: int = 0o755) -> dict[str, Any]:
    return {"p": path, "t": "d", "m": mode}


def roots() -> list[dict[str, Any]]:
    return [dentry(r, 0o755) for r in FILE_ROOTS]


def jl(*recs: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in recs)


def honest_summary(records: list[tuple[int, bytes]]) -> dict[str, int]:
    """The SUMMARY a truthful sender would write after these records."""
    entries = files = data = colls = recs = 0
    lines = b""
    for rtype, body in records:
        if rtype == M.FILES:
            batch = json.loads(body)
            entries += len(batch)
            files += sum(1 for e in batch if isinstance(e, dict) and e.get("t") not in ("d", "l"))
        elif rtype == M.DATA:
            data += len(body)
        elif rtype == M.COLLECTION:
            lines += body
    for line in lines.split(b"\n"):
        if line.strip():
            recs += 1
            with contextlib.suppress(ValueError):
                colls += json.loads(line).get("t") == "collection"
    return {
        "entries": entries,
        "files": files,
        "data_bytes": data,
        "collections": colls,
        "records": recs,
    }


def seal(
    recipient: PublicKey,
    records: list[tuple[int, bytes]],
    *,
    summary: dict[str, Any] | bool | None = True,
) -> bytes:
    """A sealed stream of these payload records; an honest SUMMARY appended unless told."""
    recs = list(records)
    if summary is True:
        recs.append((M.SUMMARY, M.dump(honest_summary(records))))
    elif isinstance(summary, dict):
        recs.append((M.SUMMARY, M.dump(summary)))
    buf = io.BytesIO()
    w = StreamWriter(buf, recipient, {"kind": "lnk-move", "phase": "full"}, workers=1)
    for rtype, body in recs:
        for start in range(0, max(len(body), 1), RECORD_MAX):
            w.write(rtype, body[start : start + RECORD_MAX])
    w.close()
    return buf.getvalue()


def payload(
    h: dict[str, Any], entries: list[dict[str, Any]], data: bytes = b"", collections: bytes = b""
) -> list[tuple[int, bytes]]:
    recs: list[tuple[int, bytes]] = [(M.HEAD, M.dump(h)), (M.FILES, M.dump(entries))]
    if data:
        recs.append((M.DATA, data))
    if collections:
        recs.append((M.COLLECTION, collections))
    return recs


def inventory_of(r: receivers.Receiver) -> Inventory:
    return r.inventory()


# ---- the real command line ------------------------------------------------------------------
def cli(
    *args: str, home: Path, stdin: Path | None = None, stdout: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``lnk`` as a black box on the machine ``home``; stdin/stdout may be files (binary)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LNK_")}
    env["HOME"] = str(home)
    fin = open(stdin, "rb") if stdin else subprocess.DEVNULL  # noqa: SIM115
    fout = open(stdout, "wb") if stdout else subprocess.PIPE  # noqa: SIM115
    try:
        return subprocess.run(
            [sys.executable, "-m", "lnk", *args],
            stdin=fin,
            stdout=fout,
            stderr=subprocess.PIPE,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        for f in (fin, fout):
            if hasattr(f, "close"):
                f.close()


def cli_ok(*args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    p = cli(*args, **kw)
    assert p.returncode == 0, f"lnk {' '.join(args)} failed ({p.returncode}): {p.stderr.decode()}"
    return p


# ---- an agent that writes while it is sent (tests/payload/test_live.py, bench) ------
WRITER = r"""
import os, sqlite3, sys, time
home, stop, pause, rename_every, db_every = sys.argv[1:3] + [float(sys.argv[3])] + [
    int(x) for x in sys.argv[4:6]
]
db = sqlite3.connect(os.path.join(home, "state.db"), isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("CREATE TABLE IF NOT EXISTS t (i INTEGER PRIMARY KEY, v TEXT)")
i = 0
open(os.path.join(home, "started"), "w").close()
with open(os.path.join(home, "agent.log"), "ab", buffering=0) as log:
    while not os.path.exists(stop):
        i += 1
        log.write(b"line %d %s\n" % (i, b"x" * 200))
        if i % rename_every == 0:
            tmp = os.path.join(home, ".status.tmp")
            with open(tmp, "wb") as f:
                f.write(b"status %d\n" % i * 50)
            os.replace(tmp, os.path.join(home, "status.txt"))
        if i % db_every == 0:
            db.execute("INSERT INTO t (v) VALUES (?)", ("row %d" % i,))
        time.sleep(pause)
db.close()
"""
# the writer's database (compared by its rows) and its start mark
WRITER_FILES = {"Home/state.db", "Home/state.db-wal", "Home/state.db-shm", "Home/started"}


def start_writer(
    home: Path, stop: Path, pause: float, rename_every: int, db_every: int
) -> subprocess.Popen[bytes]:
    """A process that appends a line to ``Home/agent.log`` every ``pause`` seconds,
    replaces ``status.txt`` by rename every ``rename_every`` lines and writes a row to
    a SQLite database in WAL mode every ``db_every`` lines, until ``stop`` exists."""
    (home / "started").unlink(missing_ok=True)
    argv = [str(home), str(stop), str(pause), str(rename_every), str(db_every)]
    p = subprocess.Popen([sys.executable, "-c", WRITER, *argv])
    while not (home / "started").exists():
        assert p.poll() is None, "the writer died"
        time.sleep(0.01)
    return p


def writer_rows(db: Path) -> list[Any]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT i, v FROM t ORDER BY i").fetchall()
    finally:
        con.close()


def files_but_writer_db(root: Path) -> dict[str, Any]:
    """An agent's files, but for the writer's database (compared by rows) and mark."""
    return {k: v for k, v in agent_files(root).items() if k not in WRITER_FILES}
