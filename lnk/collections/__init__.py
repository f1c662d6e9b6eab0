"""An agent's collections (events, notes, jobs, tools) behind one small interface.

    store = open_store("sqlite", path)          # or "files"
    cid = CollectionId("events", "link:main")
    store.append(cid, store.last_number(cid) + 1, {"role": "user", "text": "hi"})
    copy_collection(store, other_store, cid)    # export -> import, any two drivers

See docs/collections.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lnk.collections.base import (
    DEFAULT_LAPSE_MS,
    KINDS,
    MAX_NAME_CHARS,
    MAX_VALUE_BYTES,
    CollectionId,
    Event,
    Lease,
    Store,
)
from lnk.collections.files import FileStore
from lnk.collections.sqlite import SqliteStore
from lnk.errors import InvalidInput

DRIVERS = ("files", "sqlite")

__all__ = [
    "DEFAULT_LAPSE_MS",
    "DRIVERS",
    "KINDS",
    "MAX_NAME_CHARS",
    "MAX_VALUE_BYTES",
    "CollectionId",
    "Event",
    "FileStore",
    "Lease",
    "SqliteStore",
    "Store",
    "copy_collection",
    "open_store",
]


def open_store(driver: str, path: Path, **kw: Any) -> Store:
    """A store of the named driver: "files" (a directory) or "sqlite" (a database file)."""
    if driver == "files":
        return FileStore(Path(path), **kw)
    if driver == "sqlite":
        return SqliteStore(Path(path), **kw)
    raise InvalidInput(
        f"unknown collection driver {driver!r}", hint=f"use one of {', '.join(DRIVERS)}"
    )


def copy_collection(src: Store, dst: Store, cid: CollectionId, since: int = 0) -> CollectionId:
    """Carry one collection from ``src`` to ``dst`` through export/import (streaming)."""
    return dst.import_(src.export(cid, since))
