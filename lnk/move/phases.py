"""A move's two phases at the end the agent leaves: the bulk, then the final.

The bulk goes while the agent answers; the final, once it is paused, carries
only what changed since: each conversation's events after the bulk's last
(its watermarks), building on the bulk's stream.  The bulk's watermarks are
kept beside the agent's runtime, one file per receiver key, until the final
has gone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from lnk.agents.registry import Agent
from lnk.formats.keys import PublicKey
from lnk.payload.inventory import Inventory
from lnk.payload.send import send_agent
from lnk.payload.send_files import SendReport


def _bulk_file(agent: Agent, recipient: PublicKey) -> Path:
    key = hashlib.sha256(recipient.text().encode()).hexdigest()[:16]
    return agent.runtime / f"bulk-{key}.json"


def send_phase(
    agent: Agent,
    out: BinaryIO,
    recipient: PublicKey,
    phase: str,
    inventory: Inventory | None = None,
    progress: Callable[[int], None] | None = None,
) -> SendReport:
    """Send one phase (full, bulk or final) of the agent to ``recipient``."""
    since: dict[str, int] = {}
    base = None
    bulk_file = _bulk_file(agent, recipient)
    if phase == "final" and bulk_file.exists():
        held = json.loads(bulk_file.read_text())
        since, base = held.get("watermarks", {}), held.get("stream_id")
    rep = send_agent(
        agent,
        out,
        recipient,
        phase=phase,
        inventory=inventory,
        since=since,
        base_stream=base,
        progress=progress,
    )
    out.flush()
    if phase == "bulk":
        bulk_file.parent.mkdir(parents=True, exist_ok=True)
        bulk_file.write_text(json.dumps({"stream_id": rep.stream_id, "watermarks": rep.watermarks}))
    elif phase == "final":
        bulk_file.unlink(missing_ok=True)
    return rep
