"""What moves and backups both say of an agent, built once.

A stream (``payload/send.py``) and a backup snapshot (``backup/agent.py``)
carry the same HEAD (who the agent is, its settings and grants) and the same
collection lines (each export record as one compact JSON line); both are built
here, so the two can never drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from lnk.agents.registry import Agent
from lnk.collections import CollectionId, Store
from lnk.payload import manifest as M


def agent_head(agent: Agent, phase: str, base_stream: str | None = None) -> M.Head:
    """The HEAD record of ``agent``: identity, settings and grants, for ``phase``."""
    s = agent.settings
    path = agent.folders.sandbox_toml
    grants = path.read_text() if path.exists() else ""
    return M.Head(s.id, s.owner, s.name, s.to_toml(), grants, phase, base_stream)


def collection_line(rec: dict[str, Any]) -> bytes:
    """One export record as the line a COLLECTION record (or a snapshot) carries."""
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def export_lines(
    store: Store, cid: CollectionId, since: int = 0
) -> Iterator[tuple[dict[str, Any], bytes]]:
    """Each export record of one collection (events above ``since``) with its line."""
    for rec in store.export(cid, since):
        yield rec, collection_line(rec)
