"""Backup repositories: content-addressed, deduplicated, sealed to their owner.

    repo = Repository.init(open_bucket(url), owner_public)
    with SnapshotWriter(repo) as w:
        w.add_file("notes.md", 0o644, open(path, "rb"))
        snap = w.commit({"agent": "ada"})
    SnapshotReader(Repository.open(bucket, receiver_key=key), snap).restore(dest)

See docs/backup-format.md.
"""

from __future__ import annotations

from lnk.backup.maintenance import PruneReport, VerifyReport, prune, verify
from lnk.backup.reader import Entry, SnapshotReader
from lnk.backup.repository import Repository, SnapshotInfo
from lnk.backup.writer import SnapshotWriter

__all__ = [
    "Entry",
    "PruneReport",
    "Repository",
    "SnapshotInfo",
    "SnapshotReader",
    "SnapshotWriter",
    "VerifyReport",
    "prune",
    "verify",
]
