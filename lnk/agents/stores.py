"""Where an agent's collections are kept: one store in ``Agent/chats/``.

The files driver keeps a folder per collection there; the SQLite driver one
database, ``Agent/chats/store.sqlite``.  Events, a conversation's narrowed tool
list, notes and scheduled jobs all live in this one store, which only the
harness writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from lnk.collections import SqliteStore, Store, open_store

SQLITE_NAME = "store.sqlite"


def store_path(chats_dir: Path, driver: str) -> Path:
    return chats_dir / SQLITE_NAME if driver == "sqlite" else chats_dir


def clone_chats(src_chats: Path, dst_chats: Path, driver: str) -> None:
    """A copy of an agent's store that costs no data copy where it can.

    The files driver never writes a file in place (every write is a new file
    renamed or linked into place), so its events can be hard-linked; SQLite is
    copied through its online backup API.
    """
    if driver == "sqlite":
        src = src_chats / SQLITE_NAME
        dst_chats.mkdir(parents=True, exist_ok=True)
        if src.exists():
            s = SqliteStore(src)
            try:
                s.backup_to(dst_chats / SQLITE_NAME)
            finally:
                s.close()
        return
    for dirpath, dirnames, filenames in os.walk(src_chats):
        rel = Path(dirpath).relative_to(src_chats)
        (dst_chats / rel).mkdir(parents=True, exist_ok=True)
        dirnames[:] = [d for d in dirnames if not d.startswith(".staging")]
        for name in filenames:
            if name.startswith(".tmp-") or name == SQLITE_NAME:
                continue
            src = Path(dirpath) / name
            # the agent wrote this folder where it ran: a link it planted is never
            # followed (a hard link to what it names would hand the agent that file)
            if stat.S_ISREG(os.lstat(src).st_mode):
                os.link(src, dst_chats / rel / name, follow_symlinks=False)


def log_tails(chats_dir: Path, driver: str) -> dict[str, list[object]]:
    """Each log's last number and the SHA-256 of its last event: what a sender may build on."""
    out: dict[str, list[object]] = {}
    if not store_path(chats_dir, driver).exists():
        return out
    store = open_store(driver, store_path(chats_dir, driver))
    try:
        for cid in store.collections():
            if cid.shape != "log":
                continue
            last = store.last_number(cid)
            if last:
                ev = store.read(cid, last, last + 1)[0]
                digest = hashlib.sha256(json.dumps(ev.data, sort_keys=True).encode()).hexdigest()
                out[f"{cid.kind}/{cid.name}"] = [last, digest]
    finally:
        store.close()
    return out


def detect_driver(chats_dir: Path) -> str:
    return "sqlite" if (chats_dir / SQLITE_NAME).exists() else "files"


def open_agent_store(chats_dir: Path, driver: str, lapse_s: float = 60) -> Store:
    chats_dir.mkdir(parents=True, exist_ok=True)
    return open_store(driver, store_path(chats_dir, driver), lapse_ms=max(1, int(lapse_s * 1000)))
