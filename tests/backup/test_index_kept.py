"""The blob index a backup keeps on this machine: read whole when the repository's
packs are the same, only new packs' indexes fetched when it grew, built again when
it lost one (a prune, a damaged pack), and never believed when damaged on disk."""

from __future__ import annotations

import hashlib
import io
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from backup_helpers import CountingBucket
from bk_helpers import sample_agent

from lnk.agents.layout import Machine
from lnk.backup import Repository, SnapshotWriter, agent_keys, indexcache, prune
from lnk.backup.agent import backup_agent
from lnk.backup.agent_repos import open_with_keys
from lnk.backup.blobindex import BlobIndex, IndexBuilder
from lnk.backup.pack import pack_key
from lnk.formats.keys import ReceiverKey
from lnk.transport.buckets import open_bucket


def _index(n: int, packs: int = 3) -> BlobIndex:
    b = IndexBuilder()
    for p in range(packs):
        blobs = [
            (hashlib.sha256(f"{p}/{i}".encode()).digest(), "tree" if i % 7 else "data", i, 9)
            for i in range(n)
        ]
        b.add_pack(f"pack-{p}", blobs, False)
    return b.build()


def test_a_kept_index_reads_back_as_it_was(tmp_path: Path) -> None:
    index = _index(500)
    path = tmp_path / "kept"
    indexcache.save(path, "ab" * 16, index, frozenset({"pack-0", "pack-1", "pack-2", "x"}))
    kept = indexcache.load(path, "ab" * 16)
    assert kept is not None
    assert kept.loaded == {"pack-0", "pack-1", "pack-2", "x"}
    assert dict(kept.index.items()) == dict(index.items()) and len(kept.index) == 1500
    probe = hashlib.sha256(b"2/499").digest()
    assert kept.index.packs_of(probe + b"\0" * 32) == ({"pack-2"}, [b"\0" * 32])
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert indexcache.load(path, "cd" * 16) is None  # another repository's


@pytest.mark.parametrize("where", ["magic", "header", "record", "heads", "fanout", "digest"])
def test_a_kept_index_damaged_on_disk_is_not_believed(tmp_path: Path, where: str) -> None:
    path = tmp_path / "kept"
    indexcache.save(path, "ab" * 16, _index(200), frozenset({"pack-0"}))
    raw = bytearray(path.read_bytes())
    header_end = 12 + int.from_bytes(raw[8:12], "big")
    records_end = header_end + 600 * 54
    at = {
        "magic": 2,
        "header": 20,
        "record": header_end + 54 * 300 + 40,
        "heads": records_end + 8 * 17,
        "fanout": len(raw) - 32 - 8 * 100,
        "digest": len(raw) - 1,
    }[where]
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    assert indexcache.load(path, "ab" * 16) is None


def test_a_short_or_long_kept_index_is_not_believed(tmp_path: Path) -> None:
    path = tmp_path / "kept"
    indexcache.save(path, "ab" * 16, _index(50), frozenset())
    raw = path.read_bytes()
    for bad in (raw[:-1], raw + b"\0", raw[:100], b""):
        path.write_bytes(bad)
        assert indexcache.load(path, "ab" * 16) is None
    assert indexcache.load(tmp_path / "none", "ab" * 16) is None


@pytest.mark.parametrize(
    "head",
    [
        {"count": 10**12},  # a size the file is not: nothing allocated for it
        {"count": -1},
        {"packs": ["pack-0", "pack-0"]},  # the records' numbers would name others
        {"repo": 7},
        {"loaded": "pack-0"},
    ],
)
def test_a_kept_index_with_a_header_that_lies_is_not_believed(
    tmp_path: Path, head: dict[str, object]
) -> None:
    path = tmp_path / "kept"
    indexcache.save(path, "ab" * 16, _index(20), frozenset({"pack-0"}))
    raw = path.read_bytes()
    n = int.from_bytes(raw[8:12], "big")
    doc = json.loads(raw[12 : 12 + n]) | head
    new = json.dumps(doc).encode()
    body = raw[:8] + len(new).to_bytes(4, "big") + new + raw[12 + n : -32]
    path.write_bytes(body + hashlib.sha256(body).digest())  # its digest made to match
    assert indexcache.load(path, "ab" * 16) is None


def _backup(repo: Repository, name: str, kept: Path | None) -> None:
    """A backup that keeps its index at ``kept``; None: one from another machine."""
    with SnapshotWriter(repo, kept) as w:
        for i in range(3):
            w.add_file(f"{name}/{i}", 0o644, io.BytesIO(os.urandom(2000) + name.encode()))
        w.commit({"name": name})


def _index_gets(bucket: CountingBucket) -> int:
    n = sum(1 for k in bucket.gets if k.startswith("index/"))
    bucket.gets.clear()
    return n


def test_only_new_packs_indexes_are_fetched(
    bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path
) -> None:
    repo = Repository.init(bucket, owner.public)
    kept = tmp_path / "agent" / "backup-index"
    _backup(repo, "one", None)  # from another machine: nothing kept here
    _backup(repo, "two", None)
    fresh = repo.load_index(skip_damaged=True)
    packs = len(list(bucket.list("index/")))
    bucket.gets.clear()

    same = indexcache.load_index(repo, kept)  # none kept: every index fetched
    assert dict(same.items()) == dict(fresh.items())
    assert _index_gets(bucket) == packs
    again = indexcache.load_index(repo, kept)
    assert dict(again.items()) == dict(fresh.items())
    assert _index_gets(bucket) == 0  # nothing new: the kept file is the index

    _backup(repo, "three", None)  # another machine's again
    new = len(list(bucket.list("index/"))) - packs
    bucket.gets.clear()
    grown = indexcache.load_index(repo, kept)
    assert new >= 1 and _index_gets(bucket) == new  # only its packs' indexes
    assert dict(grown.items()) == dict(repo.load_index(skip_damaged=True).items())

    _backup(repo, "four", kept)  # one here keeps its own packs as it ends
    bucket.gets.clear()
    mine = indexcache.load_index(repo, kept)
    assert _index_gets(bucket) == 0
    assert dict(mine.items()) == dict(repo.load_index(skip_damaged=True).items())


def test_a_pack_gone_or_damaged_builds_the_index_again(
    bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path
) -> None:
    repo = Repository.init(bucket, owner.public)
    kept = tmp_path / "backup-index"
    _backup(repo, "one", kept)
    bad = min(k.split("/", 1)[1] for k, _ in bucket.list("index/"))  # one of one's packs
    for name in ("two", "three"):
        _backup(repo, name, kept)
    indexcache.load_index(repo, kept)
    rest = sorted(k.split("/", 1)[1] for k, _ in bucket.list("index/") if bad not in k)
    repo.mark_damaged(bad, "test")
    bucket.gets.clear()
    healed = indexcache.load_index(repo, kept)
    assert _index_gets(bucket) == len(rest)  # built from every live index again
    assert {r.pack for r in healed.values()} == set(rest)
    assert dict(healed.items()) == dict(repo.load_index(skip_damaged=True).items())

    prune(repo, {"last": 1}, min_age=timedelta(0))
    after = indexcache.load_index(repo, kept)
    assert dict(after.items()) == dict(repo.load_index(skip_damaged=True).items())
    assert 0 < len(after) < len(healed)  # the packs of the snapshots pruned are gone
    assert all(bucket.exists(pack_key(p)) for p in {r.pack for r in after.values()})


def test_an_agents_backups_keep_the_index_with_their_own_packs(
    src: Machine, tmp_path: Path
) -> None:
    """End to end: the kept index is the agent's (in its runtime folder, by repository);
    a backup keeps it with its own packs as it ends, so the next one fetches no index
    document, the first backup's next included; the file holds what a build from
    every index document gives."""
    a = sample_agent(src)
    root = tmp_path / "bk"
    root.mkdir()
    url = f"file://{root}"
    bucket = CountingBucket(open_bucket(url))
    first = backup_agent(src, a, url, bucket=bucket)
    assert first.new_blobs > 0
    bucket.gets.clear()
    (a.folders.home / "new.txt").write_bytes(b"new " * 1000)
    rep = backup_agent(src, a, url, bucket=bucket)  # after a first backup
    assert _index_gets(bucket) == 0 and rep.new_blobs >= 1
    rep = backup_agent(src, a, url, bucket=bucket)
    assert _index_gets(bucket) == 0 and rep.new_blobs == 0
    [kept] = a.runtime.glob("backup-index-*")
    assert kept.name == f"backup-index-{rep.repository}"
    repo, _ = open_with_keys(src, bucket, url, agent_keys.ensure(src))
    held = indexcache.load(kept, repo.id)
    assert held is not None and held.loaded == set(repo.index_names())
    assert dict(held.index.items()) == dict(repo.load_index().items())


def test_a_big_repository_s_next_backup_fetches_the_last_ones_indexes(
    src: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past KEEP_AFTER_MAX blobs a backup does not make one segment of its index as it
    ends (that holds it twice): the next backup fetches its packs' indexes instead."""
    monkeypatch.setattr(indexcache, "KEEP_AFTER_MAX", 1)
    a = sample_agent(src)
    root = tmp_path / "bk"
    root.mkdir()
    url = f"file://{root}"
    bucket = CountingBucket(open_bucket(url))
    backup_agent(src, a, url, bucket=bucket)
    bucket.gets.clear()
    backup_agent(src, a, url, bucket=bucket)
    assert _index_gets(bucket) >= 1
    bucket.gets.clear()
    assert backup_agent(src, a, url, bucket=bucket).new_blobs == 0
    assert _index_gets(bucket) == 0  # kept as it loaded them


def test_the_kept_index_is_named_by_the_repositorys_canonical_id(
    bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path
) -> None:
    """A bucket's config may spell its ID with spaces, capitals or a newline (hex that
    ``bytes.fromhex`` takes): the file's name is the ID in canonical hex all the same."""
    repo = Repository.init(bucket, owner.public)
    canonical = repo.id
    repo.id = f" {canonical[:8].upper()}\n{canonical[8:]} "
    repo.id_bytes = bytes.fromhex(repo.id)
    assert indexcache.kept_path(tmp_path, repo) == tmp_path / f"backup-index-{canonical}"
