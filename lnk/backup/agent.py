"""Backing an agent up into a repository, and restoring it from one.

A snapshot of an agent (see docs/backup.md) holds, by name:

    agent/<path>              the bytes of each file that has any (Home/..., Agent/...)
    meta/entries.jsonl        every folder and file entry, as the stream's FILES entries
                              (mode, size, SHA-256, mtime, hard-link group; ``d`` when
                              its bytes are at agent/<path>), in walk order
    collections/<n>.jsonl     one collection's export records as JSON lines
    meta/head.json (blob)     the stream's HEAD: lnk-move-4.json, ID, owner, name,
                              settings, grants
    meta/summary.json (blob)  the counts a receiver checks

A restore reads the bucket's label first, then feeds the snapshot back as the
records a stream carries into :func:`lnk.payload.receive.receive_records`,
so every check and the atomic apply of a move are reused.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import IO, Any

from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.backup import agent_keys
from lnk.backup.agent_files import FilesBackup, add_collections
from lnk.backup.filecache import ChunkCache
from lnk.backup.maintenance import PruneReport, RepairReport, check_keep, prune, repair
from lnk.backup.reader import Entry, SnapshotReader
from lnk.backup.repository import Repository, SnapshotInfo
from lnk.backup.writer import SnapshotWriter
from lnk.errors import BackupError, FormatMismatch, LnkError, NotFound, Refused
from lnk.payload import manifest as M
from lnk.payload.agent_records import agent_head
from lnk.payload.hashcache import HashCache
from lnk.transport.buckets import Bucket, open_bucket

LABEL = "lnk-layout"
LAYOUT = "2"
ENTRIES = "meta/entries.jsonl"
HEAD = "meta/head.json"
SUMMARY = "meta/summary.json"
SPOOL = 4 << 20


@dataclass
class BackupReport:
    url: str
    agent: str
    id: str
    snapshot: str
    repository: str
    created_repository: bool
    entries: int = 0
    files: int = 0
    bytes: int = 0
    collections: int = 0
    records: int = 0
    new_blobs: int = 0
    labelled: bool = False
    label_problem: str | None = None
    created_key: bool = False  # this run made the owner's backup key pair
    key_note: str | None = None  # what to tell the owner about it, once
    pruned: PruneReport | None = None  # with ``keep``: the prune that followed

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["pruned"] = self.pruned.forgotten if self.pruned else None
        return d


# ---- opening a repository ---------------------------------------------------------
def open_for_writing(machine: Machine, bucket: Bucket, url: str) -> tuple[Repository, bool]:
    """The repository in ``bucket`` opened to write (made on first use), and whether it
    was made now.  The writer secret is remembered here by the repository's ID."""
    return _open_for_writing(machine, bucket, url, agent_keys.ensure(machine))


def _open_for_writing(
    machine: Machine, bucket: Bucket, url: str, keys: agent_keys.BackupKeys
) -> tuple[Repository, bool]:
    if not bucket.exists("config"):
        repo = Repository.init(bucket, keys.public)
        agent_keys.remember(machine, repo.id, repo.writer_secret, url)
        return repo, True
    plain = Repository.open(bucket)  # reads the config (once): learns the ID
    secret = keys.secret_for(plain.id)
    if secret is not None:
        repo = plain.unlock(writer_secret=secret)
    elif keys.private is not None:
        repo = plain.unlock(receiver_key=keys.private)
    else:
        raise Refused(
            f"this machine holds no writer secret for the repository in {url}",
            hint=f"install the owner's key with the repository's secret: {agent_keys.IMPORT_HINT}",
        )
    if repo.owner.raw != keys.public.raw:
        raise Refused(
            f"the repository in {url} belongs to another backup key",
            hint="back up to another URL, or import that repository's key",
        )
    agent_keys.remember(machine, repo.id, repo.writer_secret, url)
    return repo, False


def open_for_reading(machine: Machine, bucket: Bucket, url: str) -> Repository:
    private = agent_keys.require_private(agent_keys.load(machine))
    repo = Repository.open(bucket, receiver_key=private)
    agent_keys.remember(machine, repo.id, repo.writer_secret, url)
    return repo


def open_for_listing(
    machine: Machine, bucket: Bucket, url: str, *, prefer_private: bool = False
) -> Repository:
    """Writer secret or private key: enough to list, verify and prune (with
    ``prefer_private``, the private key where it is here: a repair reads data)."""
    keys = agent_keys.load(machine)
    if keys is None:
        raise Refused("this machine has no backup key", hint=agent_keys.IMPORT_HINT)
    plain = Repository.open(bucket)
    secret = keys.secret_for(plain.id)
    if secret is not None and not (prefer_private and keys.private is not None):
        return plain.unlock(writer_secret=secret)
    if keys.private is not None:
        repo = plain.unlock(receiver_key=keys.private)
        agent_keys.remember(machine, repo.id, repo.writer_secret, url)
        return repo
    raise Refused(
        f"this machine holds no writer secret for the repository in {url}",
        hint=agent_keys.IMPORT_HINT,
    )


def repair_repository(machine: Machine, url: str) -> RepairReport:
    """``lnk agent backup repair``: the repository at ``url`` opened with the strongest
    key here (the owner's, to salvage blobs), then :func:`maintenance.repair`."""
    return repair(open_for_listing(machine, open_bucket(url), url, prefer_private=True))


# ---- labels -----------------------------------------------------------------------
def label_bucket(bucket: Bucket) -> None:
    bucket.set_label(LABEL, LAYOUT)


def read_layout(bucket: Bucket) -> int:
    """The layout the bucket's label says: 2, or 1 when it has none."""
    try:
        labels = bucket.labels()
    except Refused as e:
        raise Refused(
            f"could not read the labels of {bucket.describe()}, which say how its "
            f"backups are laid out ({e.message})",
            hint="restore with your own account's credentials, which may read the bucket's labels",
        ) from e
    value = labels.get(LABEL)
    if value is None:
        return 1
    if value != LAYOUT:
        raise FormatMismatch(
            f"{bucket.describe()} is labelled {LABEL}={value}; this lnk "
            f"reads layouts 1 and {LAYOUT}",
            hint="upgrade lnk",
        )
    return 2


# ---- backing up -------------------------------------------------------------------
def backup_agent(
    machine: Machine,
    agent: Agent,
    url: str,
    *,
    bucket: Bucket | None = None,
    progress: Callable[[int], None] | None = None,
    layout: int = 2,
    time: datetime | None = None,
    keep: dict[str, int] | None = None,
) -> BackupReport:
    """Back the agent up to ``url`` as one snapshot (the agent may keep running);
    with ``keep`` (retention rules), prune after it with the same handle.

    ``layout=1`` writes the older layout (everything inside Home/, no collections,
    no label): for tests and migration tools only."""
    if keep:
        check_keep(keep)  # a bad policy fails before the backup, not after
    bucket = bucket or open_bucket(url)
    keys = agent_keys.ensure(machine)
    repo, created = _open_for_writing(machine, bucket, url, keys)
    s = agent.settings
    report = BackupReport(url, s.name, s.id, "", repo.id, created)
    if keys.created:
        report.created_key = True
        report.key_note = agent_keys.created_note(machine)
    if layout == 2:
        try:
            label_bucket(bucket)
            report.labelled = True
        except Refused as e:
            report.label_problem = (
                f"the bucket's label {LABEL}={LAYOUT} could not be set "
                f"({e.message}); set it with your own account: "
                f"lnk bucket label {url}"
            )
    head = agent_head(agent, "full")
    snap_dir = tempfile.mkdtemp(prefix="lnk-backup-")
    cache = HashCache(agent.runtime / "hashes.sqlite")
    chunks = ChunkCache(agent.runtime / "backup-chunks.sqlite", repo.id)
    entries = tempfile.SpooledTemporaryFile(max_size=SPOOL)  # noqa: SIM115
    try:
        with SnapshotWriter(repo) as w:
            files = FilesBackup(w, agent, (cache, chunks), entries, snap_dir, layout, progress)
            files.run()
            report.entries, report.files, report.bytes = files.entries, files.files, files.bytes
            entries.seek(0)
            w.add_list(ENTRIES, 0o600, entries)
            if layout == 2:
                report.collections, report.records = add_collections(w, agent, chunks)
            w.add_blob(HEAD, M.dump(head.to_json()))
            w.add_blob(
                SUMMARY,
                M.dump(
                    {
                        "entries": report.entries,
                        "files": report.files,
                        "data_bytes": report.bytes,
                        "collections": report.collections,
                        "records": report.records,
                    }
                ),
            )
            report.snapshot = w.commit(
                {
                    "kind": "lnk-agent",
                    "agent": s.name,
                    "id": s.id,
                    "layout": layout,
                    "files": report.files,
                    "bytes": report.bytes,
                    "collections": report.collections,
                },
                time=time,
            )
            report.new_blobs = w.uploaded_blobs
    finally:
        entries.close()
        cache.close()
        chunks.close()
        shutil.rmtree(snap_dir, ignore_errors=True)
    if keep:
        report.pruned = prune(repo, keep, agents={s.id})  # this agent's alone
    return report


def run_backup(
    machine: Machine,
    agent: Agent,
    url: str,
    *,
    keep: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> BackupReport:
    """``lnk agent backup``: parse the retention ``keep`` (``daily=7,...``), back up,
    prune with it, and record the run's result for ``lnk agent status`` (a failure
    too, then re-raised)."""
    from lnk.backup.schedule import parse_keep, record_result

    rules = parse_keep(keep)
    try:
        rep = backup_agent(machine, agent, url, progress=progress, keep=rules)
    except LnkError as e:
        record_result(agent, False, e.message, url=url)
        raise
    record_result(agent, True, snapshot=rep.snapshot, url=url)
    return rep


# ---- listing ----------------------------------------------------------------------
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
    for e in reader.entries():
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


def records_layout2(
    reader: SnapshotReader, parts: SnapshotParts, progress: Callable[[int], None] | None = None
) -> Iterator[tuple[int, bytes]]:
    """The snapshot as the records of a stream, in stream order."""
    yield M.HEAD, M.dump(parts.head)
    files = reader.read_ahead(data_files(reader))  # packs fetched and opened ahead
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
                    yield M.DATA, chunk

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
