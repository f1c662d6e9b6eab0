"""Where an agent's collections are kept: one store in ``Agent/chats/``.

The files driver keeps a folder per collection there; the SQLite driver one
database, ``Agent/chats/store.sqlite``.  Events, a conversation's narrowed tool
list, notes and scheduled jobs all live in this one store, which only the
harness writes.
"""

from __future__ import annotations

from pathlib import Path

from lnk.collections import Store, open_store

SQLITE_NAME = "store.sqlite"


def store_path(chats_dir: Path, driver: str) -> Path:
    return chats_dir / SQLITE_NAME if driver == "sqlite" else chats_dir


def open_agent_store(chats_dir: Path, driver: str, lapse_s: int = 60) -> Store:
    chats_dir.mkdir(parents=True, exist_ok=True)
    return open_store(driver, store_path(chats_dir, driver), lapse_ms=lapse_s * 1000)
