"""Backing an agent up into a repository: one snapshot (``agent_snapshots.py``
says what it holds), in a repository opened by ``agent_repos.py``, labelled
with its layout, pruned after it when retention rules are given.

``agent_restore.py`` puts an agent back from one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.backup import agent_keys, indexcache
from lnk.backup.agent_files import FilesBackup, add_collections
from lnk.backup.agent_repos import LABEL, LAYOUT, label_bucket, open_with_keys
from lnk.backup.agent_snapshots import ENTRIES, HEAD, SPOOL, SUMMARY
from lnk.backup.filecache import ChunkCache
from lnk.backup.maintenance import PruneReport, check_keep, prune
from lnk.backup.schedule import parse_keep, record_result
from lnk.backup.writer import SnapshotWriter
from lnk.errors import LnkError, Refused
from lnk.harnesses.setup import checked_state
from lnk.payload import manifest as M
from lnk.payload.agent_records import agent_head
from lnk.payload.hashcache import HashCache
from lnk.payload.workdir import WorkDir
from lnk.transport.buckets import Bucket, open_bucket


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
    checked_state(agent)  # an adapter's answer that names paths it must not: refused
    bucket = bucket or open_bucket(url)
    keys = agent_keys.ensure(machine)
    repo, created = open_with_keys(machine, bucket, url, keys)
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
    work = WorkDir(agent.runtime, "lnk-backup-")  # (beside the agent's files: workdir.py)
    snap_dir = str(work.path)
    cache = HashCache(agent.runtime / "hashes.sqlite")
    chunks = ChunkCache(agent.runtime / "backup-chunks.sqlite", repo.id)
    entries = tempfile.SpooledTemporaryFile(max_size=SPOOL)  # noqa: SIM115
    try:
        with SnapshotWriter(repo, indexcache.kept_path(agent.runtime, repo)) as w:
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
        work.close()
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
    rules = parse_keep(keep)
    try:
        rep = backup_agent(machine, agent, url, progress=progress, keep=rules)
    except LnkError as e:
        record_result(agent, False, e.message, url=url)
        raise
    record_result(agent, True, snapshot=rep.snapshot, url=url)
    return rep
