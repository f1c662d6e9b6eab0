"""Sending an agent: its manifest, files and collections, sealed to a receiver.

The payload's records (docs/stream-format.md, "Payload: records of an agent"):
HEAD, then FILES batches each followed by the DATA of the files in it that
carry bytes, then COLLECTION batches, then SUMMARY.  A file whose content the
receiver's inventory holds, or that this stream already carried, carries none.
The FILES and DATA records are ``send_files.py``'s; this module runs the send.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from lnk.agents.registry import Agent
from lnk.errors import StreamError
from lnk.formats.keys import PublicKey
from lnk.formats.stream import StreamWriter
from lnk.harnesses.setup import checked_state
from lnk.payload import manifest as M
from lnk.payload.agent_records import agent_head
from lnk.payload.digests import keeper
from lnk.payload.hashcache import HashCache
from lnk.payload.inventory import Inventory
from lnk.payload.kept import SentListing
from lnk.payload.reading import Readers
from lnk.payload.send_files import FileSender, SendReport
from lnk.payload.spool import send_spool, spool_collections
from lnk.payload.unchanged import SinceDigests
from lnk.payload.walk import WalkStats, walk_agent
from lnk.payload.workdir import WorkDir

# threads reading and hashing files, each through a child process of its own once a
# send has many (reading.Readers): 2 measured ahead of 4 and of 1 with threads alone,
# and ahead of 3 with the children but for a sender alone on a cold disk (bench/README.md)
READERS = 2


def _named(dirs: dict[str, str]) -> Callable[[str], str]:
    """For a bulk: the folders its inventory names held whole, taken as named.  They were
    named against this machine's own digests at the inventory's ``at``, moments ago, so
    a bulk does not walk them again to see the same; one changed since costs the final
    (which walks everything, the agent paused) its bytes, never a wrong file."""
    return lambda rel: dirs.get(rel, "")


def send_agent(
    agent: Agent,
    out: BinaryIO,
    recipient: PublicKey,
    *,
    phase: str = "full",
    inventory: Inventory | None = None,
    since: dict[str, int] | None = None,
    base_stream: str | None = None,
    level: int = 3,
    workers: int = 2,
    progress: Callable[[int], None] | None = None,
) -> SendReport:
    """Write the whole agent as one sealed stream to ``out``."""
    if phase not in M.PHASES:
        raise StreamError(f"unknown phase {phase!r}", hint="use full, bulk or final")
    since = since or {}
    folders = agent.folders
    if phase != "final":  # (not in the cutover: the agent waits for it)
        checked_state(agent)  # an adapter's answer that names paths it must not: refused
    head = agent_head(agent, phase, base_stream)
    writer = StreamWriter(
        out, recipient, {"kind": "lnk-move", "phase": phase}, level=level, workers=workers
    )
    report = SendReport(writer.stream_id.hex(), phase)
    work = WorkDir(agent.runtime, "lnk-send-")  # (beside the agent's files: workdir.py)
    snap_dir = work.path
    cache = HashCache(agent.runtime / "hashes.sqlite")
    stats = WalkStats()
    spool = tempfile.TemporaryFile(dir=snap_dir)  # noqa: SIM115 - closed below
    pool = ThreadPoolExecutor(1, "lnk-export")
    readers = Readers(READERS, snap_dir)
    try:
        writer.write(M.HEAD, M.dump(head.to_json()))
        # the HEAD goes at once: the receiver starts its check of what it holds (its
        # walk of the base) beside this send's walk, not once the stream has ended
        writer.flush()
        spooled = pool.submit(spool_collections, agent, spool, since, inventory)
        unchanged = (
            SinceDigests(inventory.dirs, inventory.at, folders.root)
            if inventory is not None
            else None
        )
        sender = FileSender(writer, inventory, report, progress, phase, cache, readers, unchanged)
        # with the receiver's folder digests, a folder it holds whole goes as one entry:
        # every folder's digest now first (a stat of each entry where the cache
        # remembers the folder), then a walk that does not go into those
        # (the final also notes every folder's listing: how the agent leaves, if it does)
        left = SentListing(cache) if phase == "final" else None
        keep = None
        if inventory is not None and phase == "bulk" and inventory.at > 0:
            keep = _named(inventory.dirs)  # (the final walks them: its word counts)
        elif inventory is not None:
            keep = keeper(inventory.dirs, folders.root, cache, listed=left, since=unchanged)
        if left is not None:
            left.done(report.stream_id)
        walk = walk_agent(
            folders.root,
            cache,
            stats,
            snap_dir,
            hash_files=False,
            links=True,
            sqlite=False,
            keep=keep,
        )
        for f in walk:
            sender.add(f)
        sender.flush()
        done = spooled.result()
        report.collections, report.collection_records = done.collections, done.records
        report.watermarks = done.watermarks
        send_spool(writer, spool)
        report.hashed_bytes += stats.hashed_bytes
        report.skipped_links = stats.skipped_links
        report.skipped_special = stats.skipped_special
        writer.write(
            M.SUMMARY,
            M.dump(
                {
                    "entries": report.entries,
                    "files": report.files,
                    "data_bytes": report.data_bytes,
                    "collections": report.collections,
                    "records": report.collection_records,
                }
            ),
        )
        summary = writer.close()
        report.wire_bytes = summary.wire_bytes
    except BaseException:
        writer.abort()
        raise
    finally:
        pool.shutdown(wait=True)
        readers.shutdown()
        spool.close()
        cache.close()
        work.close()
    return report
