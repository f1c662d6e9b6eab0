"""Sending an agent: its manifest, files and collections, sealed to a receiver.

The payload's records (docs/stream-format.md, "Payload: records of an agent"):
HEAD, then FILES batches each followed by the DATA of the files in it that
carry bytes, then COLLECTION batches, then SUMMARY.  A file whose content the
receiver's inventory holds, or that this stream already carried, carries none.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from lnk.agents.registry import Agent
from lnk.agents.stores import open_agent_store
from lnk.errors import StreamError
from lnk.formats.keys import PublicKey
from lnk.formats.stream import RECORD_MAX, StreamWriter
from lnk.payload import manifest as M
from lnk.payload.inventory import Inventory
from lnk.payload.walk import HashCache, WalkedFile, WalkStats, walk_agent

BATCH_DATA_BYTES = 8 << 20
DEDUP_MIN = 64 << 10  # content this size or more is sent once per stream


@dataclass
class SendReport:
    stream_id: str
    phase: str
    entries: int = 0
    files: int = 0
    file_bytes: int = 0  # the agent's file bytes, sent or not
    data_bytes: int = 0  # file bytes carried in this stream
    held_by_receiver: int = 0  # files whose bytes the receiver already had
    collections: int = 0
    collection_records: int = 0
    wire_bytes: int = 0
    hashed_bytes: int = 0
    skipped_links: int = 0
    skipped_special: int = 0
    watermarks: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def collection_key(kind: str, name: str) -> str:
    return f"{kind}/{name}"


class _Sender:
    def __init__(
        self,
        writer: StreamWriter,
        inventory: Inventory | None,
        report: SendReport,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.w = writer
        self.inv = inventory or Inventory()
        self.report = report
        self.progress = progress or (lambda n: None)
        self.batch: list[dict[str, Any]] = []
        self.batch_json = 0  # a bound on the batch's JSON size
        self.pending: list[WalkedFile] = []
        self.pending_bytes = 0
        self.sent: set[bytes] = set()

    def add(self, f: WalkedFile) -> None:
        # a FILES body stays within MAX_JSON_RECORD whatever the paths' length (an entry
        # is at most its path twice, escaped, and 200 bytes of fields)
        size = 2 * len(f.rel.encode()) + 200
        if self.batch and self.batch_json + size > M.MAX_JSON_RECORD:
            self.flush()
        self.batch_json += size
        r = self.report
        r.entries += 1
        if f.kind == "d":
            self.batch.append(M.FileEntry(f.rel, "d", f.mode).to_json())
        else:
            r.files += 1
            r.file_bytes += f.size
            digest = bytes.fromhex(f.sha256)
            data = f.size > 0 and f.group_first and digest not in self.sent
            if data and digest in self.inv:
                data = False
                r.held_by_receiver += 1
            if data:
                if f.size >= DEDUP_MIN:
                    # remembered only for files worth it, so memory stays bounded by
                    # bytes, not by files: a repeated small file is sent twice
                    self.sent.add(digest)
                self.pending.append(f)
                self.pending_bytes += f.size
            self.batch.append(
                M.FileEntry(
                    f.rel, "f", f.mode, f.size, f.sha256, f.group, data, f.mtime_ns
                ).to_json()
            )
        if len(self.batch) >= M.FILES_PER_RECORD or self.pending_bytes >= BATCH_DATA_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.batch:
            return
        self.w.write(M.FILES, M.dump(self.batch))
        self.batch = []
        self.batch_json = 0
        # one reused buffer, filled by readinto: no allocation and one copy fewer a MiB
        buf = bytearray(RECORD_MAX)
        view = memoryview(buf)
        fill = 0
        for f in self.pending:
            assert f.source is not None
            h = hashlib.sha256()
            left = f.size
            with open(f.source, "rb", buffering=0) as src:
                while left > 0:
                    n = src.readinto(view[fill : fill + min(RECORD_MAX - fill, left)])
                    if not n:
                        break
                    h.update(view[fill : fill + n])
                    fill += n
                    left -= n
                    if fill == RECORD_MAX:
                        self._data(view)
                        fill = 0
            if left or h.hexdigest() != f.sha256:
                raise StreamError(
                    f"{f.rel} changed while it was being sent",
                    hint="send again: only what the receiver does not hold yet goes",
                )
        if fill:
            self._data(view[:fill])
        self.pending = []
        self.pending_bytes = 0

    def _data(self, buf: memoryview) -> None:
        self.w.write(M.DATA, buf)  # the writer takes its own copy
        self.report.data_bytes += len(buf)
        self.progress(len(buf))


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
    s = agent.settings
    folders = agent.folders
    grants = folders.sandbox_toml.read_text() if folders.sandbox_toml.exists() else ""
    head = M.Head(s.id, s.owner, s.name, s.to_toml(), grants, phase, base_stream)
    writer = StreamWriter(
        out, recipient, {"kind": "lnk-move", "phase": phase}, level=level, workers=workers
    )
    report = SendReport(writer.stream_id.hex(), phase)
    snap_dir = Path(tempfile.mkdtemp(prefix="lnk-send-"))
    cache = HashCache(agent.runtime / "hashes.sqlite")
    stats = WalkStats()
    spool = tempfile.TemporaryFile(dir=snap_dir)  # noqa: SIM115 - closed below
    pool = ThreadPoolExecutor(1, "lnk-export")
    try:
        writer.write(M.HEAD, M.dump(head.to_json()))
        spooled = pool.submit(_spool_collections, agent, spool, since, inventory)
        sender = _Sender(writer, inventory, report, progress)
        for f in walk_agent(folders.root, cache, stats, snap_dir):
            sender.add(f)
        sender.flush()
        done = spooled.result()
        report.collections, report.collection_records = done.collections, done.records
        report.watermarks = done.watermarks
        _send_spool(writer, spool)
        report.hashed_bytes = stats.hashed_bytes
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
        spool.close()
        cache.close()
        shutil.rmtree(snap_dir, ignore_errors=True)
    return report


@dataclass
class _Spooled:
    collections: int = 0
    records: int = 0
    watermarks: dict[str, int] = field(default_factory=dict)


def _spool_collections(
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
            for rec in store.export(cid, start):
                if rec.get("t") == "event":
                    last = max(last, int(rec["n"]))
                spool.write(json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode())
                spool.write(b"\n")
                out.records += 1
            if cid.shape == "log":
                out.watermarks[key] = last
    finally:
        store.close()
    return out


def _send_spool(writer: StreamWriter, spool: BinaryIO) -> None:
    """The spooled lines as COLLECTION records, cut anywhere (a line may span records)."""
    spool.seek(0)
    while chunk := spool.read(RECORD_MAX):
        writer.write(M.COLLECTION, chunk)


def _event_digest(store: Any, cid: Any, n: int) -> str:
    ev = store.read(cid, n, n + 1)
    if not ev:
        return ""
    return hashlib.sha256(json.dumps(ev[0].data, sort_keys=True).encode()).hexdigest()
