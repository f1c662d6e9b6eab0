"""An agent's snapshot: what it holds, and reading it back.

A snapshot of an agent (see docs/backup.md) holds, by name:

    agent/<path>              the bytes of each file that has any (Home/..., Agent/...)
    meta/entries.jsonl        every folder and file entry, as the stream's FILES entries
                              (mode, size, SHA-256, mtime, hard-link group; ``d`` when
                              its bytes are at agent/<path>), in walk order
    collections/<n>.jsonl     one collection's export records as JSON lines
    meta/head.json (blob)     the stream's HEAD: lnk-move-4.json, ID, owner, name,
                              settings, grants
    meta/summary.json (blob)  the counts a receiver checks

``agent.py`` writes it.  Here a repository's snapshots are listed and picked,
and one is read back as the records a stream carries, in stream order, for
``agent_restore.py`` to feed into :func:`lnk.payload.receive.receive_records`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from lnk.backup.reader import AGENT_FILE_LINE, Entry, SnapshotReader, Zstd
from lnk.backup.repository import Repository, SnapshotInfo
from lnk.errors import BackupError, NotFound
from lnk.payload import manifest as M

ENTRIES = "meta/entries.jsonl"
HEAD = "meta/head.json"
SUMMARY = "meta/summary.json"
SPOOL = 4 << 20


def snapshot_row(s: SnapshotInfo) -> dict[str, Any]:
    return {
        "id": s.id,
        "time": s.time.isoformat(),
        "agent": s.meta.get("agent"),
        "agent_id": s.meta.get("id"),
        "files": s.meta.get("files", s.files),
        "bytes": s.meta.get("bytes", s.bytes),
        "collections": s.meta.get("collections", 0),
        "layout": s.meta.get("layout"),
    }


def pick_snapshot(repo: Repository, name: str, snapshot: str | None) -> SnapshotInfo:
    snaps = repo.list_snapshots()
    if snapshot is not None:
        found = [s for s in snaps if s.id == snapshot or s.id.startswith(snapshot)]
        if len(found) != 1:
            raise NotFound(
                f"no snapshot {snapshot!r} in {repo.bucket.describe()}"
                if not found
                else f"{snapshot!r} names {len(found)} snapshots",
                hint=f"lnk agent backup list --from {repo.bucket.describe()}",
            )
        return found[0]
    mine = [s for s in snaps if s.meta.get("agent") == name]
    if not mine:
        names = sorted({str(s.meta.get("agent")) for s in snaps})
        raise NotFound(
            f"no backup of {name!r} in {repo.bucket.describe()}"
            + (f" (it holds {', '.join(names)})" if names else " (it is empty)"),
            hint=f"lnk agent backup list --from {repo.bucket.describe()}",
        )
    return mine[-1]


# ---- reading a snapshot back as records -------------------------------------------
@dataclass
class SnapshotParts:
    head: dict[str, Any]
    summary: dict[str, Any]
    entries: IO[bytes]  # a local temporary copy of meta/entries.jsonl
    collections: list[Entry]
    others: list[str]  # names this lnk does not know


def read_parts(reader: SnapshotReader) -> SnapshotParts:
    head: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    entries = tempfile.SpooledTemporaryFile(max_size=SPOOL)  # noqa: SIM115
    colls: list[Entry] = []
    others: list[str] = []
    have_entries = False
    for e in reader.entries(skip=AGENT_FILE_LINE):  # the files: read (and checked) later
        if e.kind == "blob" and e.path == HEAD:
            head = _json_obj(b"".join(reader.open(e)), "manifest")
        elif e.kind == "blob" and e.path == SUMMARY:
            summary = _json_obj(b"".join(reader.open(e)), "summary")
        elif e.kind == "file" and e.path == ENTRIES:
            for part in reader.open(e):
                entries.write(part)
            have_entries = True
        elif e.kind == "file" and e.path.startswith("collections/"):
            colls.append(e)
        elif not e.path.startswith("agent/"):
            others.append(e.path)
    if head is None or summary is None or not have_entries:
        entries.close()
        raise BackupError(
            f"snapshot {reader.info.id} is not an agent's backup (no manifest, entries or summary)",
            hint="pick another snapshot: lnk agent backup list",
        )
    entries.seek(0)
    return SnapshotParts(head, summary, entries, colls, others)


def _json_obj(raw: bytes, what: str) -> dict[str, Any]:
    d = M.load_json(raw, what)
    if not isinstance(d, dict):
        raise M.bad(f"the snapshot's {what} is not an object")
    return d


def data_files(reader: SnapshotReader) -> Iterator[Entry]:
    for e in reader.entries():
        if e.kind == "file" and e.path.startswith("agent/"):
            yield e


def next_data(files: Iterator[Entry], path: str) -> Entry:
    e = next(files, None)
    if e is None or e.path != f"agent/{path}":
        raise BackupError(
            f"the snapshot's bytes of {path!r} are missing or out of order",
            hint="the snapshot is damaged; pick another (lnk agent backup list)",
        )
    return e


DATA_ZSTD = 0xFD
"""Between a restore's two processes only: a DATA record whose body is still in the zstd
frame the backup stored it in (``records_layout2(..., compressed=True)``)."""


def records_layout2(
    reader: SnapshotReader,
    parts: SnapshotParts,
    progress: Callable[[int], None] | None = None,
    compressed: bool = False,
) -> Iterator[tuple[int, bytes]]:
    """The snapshot as the records of a stream, in stream order; with ``compressed``, a
    data chunk stored compressed comes as a :data:`DATA_ZSTD` record."""
    yield M.HEAD, M.dump(parts.head)
    # packs fetched and opened ahead
    files = reader.read_ahead(data_files(reader), compressed=compressed)
    batch: list[dict[str, Any]] = []
    raw: list[bytes] = []  # the lines as stored: checked here, parsed again by the receiver

    def flush() -> Iterator[tuple[int, bytes]]:
        yield M.FILES, b"[" + b",".join(raw) + b"]"
        for d in batch:
            if isinstance(d, dict) and d.get("d") is True:
                path = str(d.get("p"))
                got = next(files, None)
                if got is None or got[0].path != f"agent/{path}":
                    next_data(iter(()), path)  # raises: missing or out of order
                assert got is not None
                for chunk in got[1]:
                    if progress:
                        progress(len(chunk))
                    yield (DATA_ZSTD if type(chunk) is Zstd else M.DATA), chunk

    try:
        for line in parts.entries:
            batch.append(M.load_json(line, "file list"))
            raw.append(line.rstrip(b"\n"))
            if len(batch) >= M.FILES_PER_RECORD:
                yield from flush()
                batch, raw = [], []
        if batch:
            yield from flush()
    finally:
        files.close()  # stops the read-ahead threads
    for e in parts.collections:
        for chunk in reader.open(e):
            yield M.COLLECTION, chunk
    yield M.SUMMARY, M.dump(parts.summary)
