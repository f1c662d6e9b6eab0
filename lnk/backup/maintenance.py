"""Checking and thinning a repository: :func:`verify` and :func:`prune`.

Both need the writer secret (they read indexes and snapshots), never the
owner's private key: a pack's SHA-256, kept in its index, proves its bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lnk.backup.blobindex import BlobRef
from lnk.backup.locks import holder_gone
from lnk.backup.pack import pack_key
from lnk.backup.reader import SnapshotReader
from lnk.backup.repository import Repository, SnapshotInfo
from lnk.backup.writer import SnapshotWriter
from lnk.errors import InvalidInput, LnkError, NotFound

RULES = ("last", "hourly", "daily", "weekly", "monthly", "yearly")
LOCK_STALE = timedelta(hours=1)
MIN_AGE = timedelta(hours=1)


@dataclass
class VerifyReport:
    snapshots: int = 0
    packs: int = 0
    packs_read: int = 0
    problems: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)  # packs recorded damaged by this run
    healed: list[str] = field(default_factory=list)  # damaged packs whose blobs are stored again

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "snapshots": self.snapshots,
            "packs": self.packs,
            "packs_read": self.packs_read,
            "problems": self.problems,
            "damaged": self.damaged,
            "healed": self.healed,
        }


@dataclass
class PruneReport:
    kept: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    deleted_packs: list[str] = field(default_factory=list)
    deferred: bool = False  # a backup was in progress: no pack deleted
    cleared_locks: list[str] = field(default_factory=list)  # left by a process that is gone
    dry_run: bool = False  # nothing was removed: "forgotten" is what would be
    groups: int = 0  # the agents whose snapshots the rules were applied to

    def to_json(self) -> dict[str, object]:
        return {
            "kept": self.kept,
            "forgotten": self.forgotten,
            "deleted_packs": self.deleted_packs,
            "deferred": self.deferred,
            "cleared_locks": self.cleared_locks,
            "dry_run": self.dry_run,
            "groups": self.groups,
        }

    def describe(self) -> str:
        would = "would " if self.dry_run else ""
        forgot = "forget" if self.dry_run else "forgot"
        deleted = "delete" if self.dry_run else "deleted"
        return (
            f"kept {len(self.kept)}, {would}{forgot} {len(self.forgotten)} snapshot(s) of "
            f"{self.groups} agent(s), {would}{deleted} {len(self.deleted_packs)} pack(s)"
            + (" (a backup runs: packs kept for now)" if self.deferred else "")
        )


def verify(repo: Repository, read_data: bool = False, *, record: bool = True) -> VerifyReport:
    """Check that every pack a snapshot needs is there, with the size its index says
    (a listing: no pack is downloaded), and its index opens.

    With ``read_data`` every such pack is also downloaded and its SHA-256 compared with
    its index.  A pack found missing, short or corrupted is recorded
    (``damaged/<pack>``, unless ``record`` is false): the next backup then stores its
    blobs again and readers look for them elsewhere.  A damaged pack every blob of
    which is stored again elsewhere is *healed*: no longer a problem."""
    report = VerifyReport()
    sizes = {k.rsplit("/", 1)[1]: n for k, n in repo.bucket.list("data/")}
    indexed = set(repo.index_names())
    damaged = repo.damaged_packs()
    needed: set[str] = set()
    for key, _ in repo.bucket.list("snapshots/"):
        report.snapshots += 1
        try:
            needed.update(repo.snapshot(key.split("/", 1)[1]).packs)
        except LnkError as e:
            report.problems.append(f"{key}: {e.message}")
    indexes = repo.read_indexes(sorted(needed & indexed), missing_ok=True)
    bad: dict[str, str] = {}  # pack -> what is wrong, found now
    for pack in sorted(needed):
        report.packs += 1
        index = indexes.get(pack)
        if pack in damaged:
            continue  # recorded before: judged below by whether its blobs have copies
        if pack not in sizes:
            bad[pack] = "is missing"
            continue
        if index is None:
            report.problems.append(f"index/{pack} is missing")
            continue
        if int(index["size"]) != sizes[pack]:
            bad[pack] = f"is {sizes[pack]} bytes, its index says {index['size']}"
            continue
        if read_data:
            report.packs_read += 1
            if hashlib.sha256(repo.bucket.get(pack_key(pack))).hexdigest() != index["sha256"]:
                bad[pack] = "is corrupted (its SHA-256 does not match)"
    for pack, why in bad.items():
        if record:
            repo.mark_damaged(pack, why)
            report.damaged.append(pack)
        report.problems.append(
            f"pack {pack} {why}"
            + ("; recorded: the next backup stores its blobs again" if record else "")
        )
    healthy = repo.load_index(skip_damaged=True, missing_ok=True) if needed & damaged else {}
    for pack in sorted(needed & damaged):
        index = indexes.get(pack)
        if index is not None and not _unhealed(index, healthy):
            report.healed.append(pack)
        else:
            why = "is missing" if pack not in sizes else _recorded_reason(repo, pack)
            report.problems.append(
                f"pack {pack} {why}, and some of its blobs are stored nowhere else "
                "(back up again, or run repair with the owner's key)"
            )
    return report


@dataclass
class RepairReport:
    verify: VerifyReport
    salvaged: int = 0  # blobs of damaged packs stored again from their intact copies
    lost: int = 0  # blobs no pack holds intact: a backup of their source stores them again
    needs_key: bool = False  # salvaging needs the owner's private key, absent here
    damaged: list[str] = field(default_factory=list)  # packs this repair found damaged

    def to_json(self) -> dict[str, object]:
        return {
            "verify": self.verify.to_json(),
            "damaged": self.damaged,
            "salvaged": self.salvaged,
            "lost": self.lost,
            "needs_key": self.needs_key,
        }


def repair(repo: Repository) -> RepairReport:
    """``verify --read-data`` (recording every damaged pack), then, with the owner's
    key, store again every blob of a damaged pack that no other pack holds and that
    still opens (each blob authenticates on its own: one flipped byte loses one
    blob, not the pack).  What is lost stays a problem until a backup of its source
    stores it again."""
    first = verify(repo, read_data=True)
    report = RepairReport(first, damaged=list(first.damaged))
    damaged = repo.damaged_packs()
    snaps = repo.list_snapshots()
    needers = {p: s.id for s in snaps for p in s.packs if p in damaged}
    if not needers:
        return report
    if not repo.can_read:
        report.needs_key = True
        return report
    healthy = repo.load_index(skip_damaged=True, missing_ok=True)
    writer = SnapshotWriter(repo)
    try:
        for pack, snap in sorted(needers.items()):
            index = repo.read_indexes([pack], missing_ok=True).get(pack)
            if index is None:
                continue
            reader = SnapshotReader(repo, snap)
            for blob_hex, kind, offset, length in index["blobs"]:
                blob_id = bytes.fromhex(blob_hex)
                if blob_id in healthy:
                    continue
                try:
                    plain = reader.open_blob(BlobRef(pack, offset, length, kind), blob_id)
                except (LnkError, NotFound):
                    report.lost += 1
                    continue
                writer.store_blob(kind, plain)
                healthy[blob_id] = BlobRef(pack, offset, length, kind)
                report.salvaged += 1
        writer.close_without_snapshot()
    except BaseException:
        writer.abort()
        raise
    report.verify = verify(repo, read_data=False)
    return report


def _recorded_reason(repo: Repository, pack: str) -> str:
    try:
        return str(repo.read_object(f"damaged/{pack}").get("reason", "is damaged"))
    except LnkError:
        return "is damaged"


def _unhealed(index: dict[str, Any], healthy: Mapping[bytes, object]) -> list[str]:
    """The blobs of a damaged pack's ``index`` that no undamaged pack holds."""
    blobs = index.get("blobs", [])
    assert isinstance(blobs, list)
    return [b[0] for b in blobs if bytes.fromhex(b[0]) not in healthy]


def replacement_packs(repo: Repository, packs: set[str]) -> set[str]:
    """The undamaged packs that hold copies of the blobs of the damaged ``packs``:
    a snapshot that needs a damaged pack needs those too."""
    damaged = repo.damaged_packs() & packs
    if not damaged:
        return set()
    copies = repo.blob_copies()
    wanted: set[bytes] = set()
    for doc in repo.read_indexes(damaged, missing_ok=True).values():
        wanted.update(bytes.fromhex(b[0]) for b in doc["blobs"])
    all_damaged = repo.damaged_packs()
    return {r.pack for b in wanted for r in copies.get(b, []) if r.pack not in all_damaged}


def check_keep(keep: dict[str, int]) -> None:
    """InvalidInput unless ``keep`` is a policy of known rules that keeps something."""
    for name, n in keep.items():
        if name not in RULES:
            raise InvalidInput(f"unknown keep rule {name!r}", hint=f"use {', '.join(RULES)}")
        if not isinstance(n, int) or n < 0:
            raise InvalidInput(f"keep rule {name} needs a count >= 0, not {n!r}")
    if not any(keep.values()):
        raise InvalidInput(
            "a keep policy that keeps nothing", hint="keep at least one snapshot, e.g. {'last': 1}"
        )


def group_of(s: SnapshotInfo) -> str:
    """The agent a snapshot belongs to: its ID (a snapshot of an older writer without one,
    its name).  Rules keep each agent's snapshots apart, as restic's ``--group-by``."""
    return str(s.meta.get("id") or s.meta.get("agent") or "")


def select(snapshots: list[SnapshotInfo], keep: dict[str, int]) -> set[str]:
    """IDs of the snapshots ``keep`` keeps (restic-like rules), of each agent on its own.

    ``last: n`` keeps each agent's n newest; ``daily: n`` the newest snapshot of
    each of the n newest days that have one; likewise hourly, weekly (ISO
    weeks), monthly and yearly.  A snapshot kept by any rule is kept."""
    check_keep(keep)
    groups: dict[str, list[SnapshotInfo]] = {}
    for s in snapshots:
        groups.setdefault(group_of(s), []).append(s)
    kept: set[str] = set()
    for group in groups.values():
        kept |= _select_one(group, keep)
    return kept


def _select_one(snapshots: list[SnapshotInfo], keep: dict[str, int]) -> set[str]:
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
    agents: set[str] | None = None,
    now: datetime | None = None,
    min_age: timedelta = MIN_AGE,
    dry_run: bool = False,
) -> PruneReport:
    """Forget the snapshots ``keep`` does not keep, each agent's on their own, then delete
    the packs no kept snapshot needs.

    ``agents`` (IDs, or names of snapshots that carry no ID) limits the rules to
    those agents' snapshots: every other agent's are kept whatever the rules say
    (a backup's ``--keep`` prunes its own agent's alone).

    Safe beside a running backup: if any in-progress marker younger than an
    hour exists, no pack is deleted (``deferred``) -- except a marker left on this
    host by a process that is gone, which is cleared at once -- and a pack younger than
    ``min_age`` (by the storage service's clock) is never deleted.  A backup
    that reused a pack deleted under it notices at its commit and fails."""
    now = now or datetime.now(UTC)
    report = PruneReport(dry_run=dry_run)
    snapshots = repo.list_snapshots()
    mine = [s for s in snapshots if agents is None or group_of(s) in agents]
    report.groups = len({group_of(s) for s in mine})
    kept = select(mine, keep) | {s.id for s in snapshots if agents is not None and s not in mine}
    for s in snapshots:
        (report.kept if s.id in kept else report.forgotten).append(s.id)
    if not dry_run:
        for sid in report.forgotten:
            repo.bucket.delete(f"snapshots/{sid}")
    live_locks = []
    for info in repo.bucket.entries("locks/"):
        if now - info.modified >= LOCK_STALE:
            continue
        if _lock_gone(repo, info.key):
            report.cleared_locks.append(info.key)
            if not dry_run:
                repo.bucket.delete(info.key)
            continue
        live_locks.append(info.key)
    if live_locks:
        report.deferred = True
        return report
    needed: set[str] = set()
    for s in repo.list_snapshots() if not dry_run else [x for x in snapshots if x.id in kept]:
        needed.update(s.packs)
    needed |= replacement_packs(repo, needed)
    for info in repo.bucket.entries("data/"):
        name = info.key.rsplit("/", 1)[1]
        if name in needed or now - info.modified < min_age:
            continue
        report.deleted_packs.append(name)
        if not dry_run:
            repo.bucket.delete(f"index/{name}")  # first: no new run dedupes against it
            repo.bucket.delete(info.key)
            repo.bucket.delete(f"damaged/{name}")
    present = {k.rsplit("/", 1)[1] for k, _ in repo.bucket.list("data/")}
    if not dry_run:
        for name in set(repo.index_names()) - present - needed:
            repo.bucket.delete(f"index/{name}")  # an index whose pack never landed
        for name in repo.damaged_packs() - present - needed:
            repo.bucket.delete(f"damaged/{name}")
    return report


def _lock_gone(repo: Repository, key: str) -> bool:
    """Whether the lock ``key`` was left by a process on this host that is gone."""
    try:
        doc = json.loads(repo.bucket.get(key))
    except (NotFound, ValueError):
        return False
    return isinstance(doc, dict) and holder_gone(doc)
