"""Checking and thinning a repository: :func:`verify` and :func:`prune`.

Both need the writer secret (they read indexes and snapshots), never the
owner's private key: a pack's SHA-256, kept in its index, proves its bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from lnk.backup.pack import pack_key
from lnk.backup.repository import Repository, SnapshotInfo
from lnk.errors import InvalidInput, LnkError

RULES = ("last", "hourly", "daily", "weekly", "monthly", "yearly")
LOCK_STALE = timedelta(hours=1)
MIN_AGE = timedelta(hours=1)


@dataclass
class VerifyReport:
    snapshots: int = 0
    packs: int = 0
    packs_read: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class PruneReport:
    kept: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    deleted_packs: list[str] = field(default_factory=list)
    deferred: bool = False  # a backup was in progress: no pack deleted


def verify(repo: Repository, read_data: bool = False) -> VerifyReport:
    """Check that every snapshot's packs and indexes are there and intact.

    With ``read_data`` every referenced pack is downloaded and its SHA-256
    compared with its index."""
    report = VerifyReport()
    sizes = {k.rsplit("/", 1)[1]: n for k, n in repo.bucket.list("data/")}
    indexed = {k.split("/", 1)[1] for k, _ in repo.bucket.list("index/")}
    needed: set[str] = set()
    for key, _ in repo.bucket.list("snapshots/"):
        report.snapshots += 1
        try:
            needed.update(repo.snapshot(key.split("/", 1)[1]).packs)
        except LnkError as e:
            report.problems.append(f"{key}: {e.message}")
    for pack in sorted(needed):
        report.packs += 1
        if pack not in sizes:
            report.problems.append(f"pack {pack} is missing")
            continue
        if pack not in indexed:
            report.problems.append(f"index/{pack} is missing")
            continue
        try:
            index = repo.read_index(pack)
        except LnkError as e:
            report.problems.append(f"index/{pack}: {e.message}")
            continue
        if int(index["size"]) != sizes[pack]:
            report.problems.append(
                f"pack {pack} is {sizes[pack]} bytes, its index says {index['size']}"
            )
            continue
        if read_data:
            report.packs_read += 1
            if hashlib.sha256(repo.bucket.get(pack_key(pack))).hexdigest() != index["sha256"]:
                report.problems.append(f"pack {pack} is corrupted (its SHA-256 does not match)")
    return report


def select(snapshots: list[SnapshotInfo], keep: dict[str, int]) -> set[str]:
    """IDs of the snapshots ``keep`` keeps (restic-like rules).

    ``last: n`` keeps the n newest; ``daily: n`` the newest snapshot of each
    of the n newest days that have one; likewise hourly, weekly (ISO weeks),
    monthly and yearly.  A snapshot kept by any rule is kept."""
    for name, n in keep.items():
        if name not in RULES:
            raise InvalidInput(f"unknown keep rule {name!r}", hint=f"use {', '.join(RULES)}")
        if not isinstance(n, int) or n < 0:
            raise InvalidInput(f"keep rule {name} needs a count >= 0, not {n!r}")
    if not any(keep.values()):
        raise InvalidInput(
            "a keep policy that keeps nothing", hint="keep at least one snapshot, e.g. {'last': 1}"
        )
    newest_first = sorted(snapshots, key=lambda s: (s.time, s.id), reverse=True)
    kept: set[str] = set()
    for rule, n in keep.items():
        periods: list[object] = []
        for s in newest_first:
            if len(periods) >= n:
                break
            period = _period(rule, s)
            if period in periods:
                continue
            periods.append(period)
            kept.add(s.id)
    return kept


def _period(rule: str, s: SnapshotInfo) -> object:
    t = s.time.astimezone(UTC)
    if rule == "last":
        return s.id
    if rule == "hourly":
        return (t.year, t.month, t.day, t.hour)
    if rule == "daily":
        return t.date()
    if rule == "weekly":
        iso = t.isocalendar()
        return (iso.year, iso.week)
    if rule == "monthly":
        return (t.year, t.month)
    return t.year


def prune(
    repo: Repository,
    keep: dict[str, int],
    *,
    now: datetime | None = None,
    min_age: timedelta = MIN_AGE,
    dry_run: bool = False,
) -> PruneReport:
    """Forget the snapshots ``keep`` does not keep, then delete the packs no
    kept snapshot needs.

    Safe beside a running backup: if any in-progress marker younger than an
    hour exists, no pack is deleted (``deferred``), and a pack younger than
    ``min_age`` (by the storage service's clock) is never deleted.  A backup
    that reused a pack deleted under it notices at its commit and fails."""
    now = now or datetime.now(UTC)
    report = PruneReport()
    snapshots = repo.list_snapshots()
    kept = select(snapshots, keep)
    for s in snapshots:
        (report.kept if s.id in kept else report.forgotten).append(s.id)
    if not dry_run:
        for sid in report.forgotten:
            repo.bucket.delete(f"snapshots/{sid}")
    live_locks = [i for i in repo.bucket.entries("locks/") if now - i.modified < LOCK_STALE]
    if live_locks:
        report.deferred = True
        return report
    needed: set[str] = set()
    for s in repo.list_snapshots() if not dry_run else [x for x in snapshots if x.id in kept]:
        needed.update(s.packs)
    for info in repo.bucket.entries("data/"):
        name = info.key.rsplit("/", 1)[1]
        if name in needed or now - info.modified < min_age:
            continue
        report.deleted_packs.append(name)
        if not dry_run:
            repo.bucket.delete(f"index/{name}")  # first: no new run dedupes against it
            repo.bucket.delete(info.key)
    indexed_only = {k.split("/", 1)[1] for k, _ in repo.bucket.list("index/")}
    present = {k.rsplit("/", 1)[1] for k, _ in repo.bucket.list("data/")}
    for name in indexed_only - present - needed:
        if not dry_run:
            repo.bucket.delete(f"index/{name}")  # an index whose pack never landed
    return report
