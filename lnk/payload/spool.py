"""An agent's collections for a stream: exported as JSON lines into a spool file (on a
thread of its own, beside the files), then sent as COLLECTION records cut anywhere.

A log the receiver holds up to an event both ends agree on (its inventory says
which) goes only from there.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from lnk.agents.registry import Agent
from lnk.agents.stores import open_agent_store
from lnk.formats.stream import RECORD_MAX, StreamWriter
from lnk.payload import manifest as M
from lnk.payload.agent_records import export_lines
from lnk.payload.inventory import Inventory


def collection_key(kind: str, name: str) -> str:
    return f"{kind}/{name}"


@dataclass
class _Spooled:
    collections: int = 0
    records: int = 0
    watermarks: dict[str, int] = field(default_factory=dict)


def spool_collections(
    agent: Agent, spool: BinaryIO, since: dict[str, int], inventory: Inventory | None
) -> _Spooled:
    """Export every collection as JSON lines into ``spool`` (one export record a line).

    It runs on a thread of its own while the files go, so reading a conversation's
    many small files overlaps the hashing and sealing of the agent's files.
    """
    s = agent.settings
    store = open_agent_store(agent.folders.chats, s.store, s.lapse_s)
    out = _Spooled()
    try:
        for cid in store.collections():
            key = collection_key(cid.kind, cid.name)
            start = 0
            if cid.shape == "log":
                start = since.get(key, 0)
                if not start and inventory is not None and inventory.logs:
                    start = inventory.log_since(
                        key, store.last_number(cid), lambda n, c=cid: _event_digest(store, c, n)
                    )
            last = start
            out.collections += 1
            for rec, line in export_lines(store, cid, start):
                if rec.get("t") == "event":
                    last = max(last, int(rec["n"]))
                spool.write(line)
                out.records += 1
            if cid.shape == "log":
                out.watermarks[key] = last
    finally:
        store.close()
    return out


def send_spool(writer: StreamWriter, spool: BinaryIO) -> None:
    """The spooled lines as COLLECTION records, cut anywhere (a line may span records)."""
    spool.seek(0)
    while chunk := spool.read(RECORD_MAX):
        writer.write(M.COLLECTION, chunk)


def _event_digest(store: Any, cid: Any, n: int) -> str:
    ev = store.read(cid, n, n + 1)
    if not ev:
        return ""
    return hashlib.sha256(json.dumps(ev[0].data, sort_keys=True).encode()).hexdigest()
