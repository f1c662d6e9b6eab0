"""A snapshot is read back in ranges of its packs, never a pack whole (lnk.backup.reader):
each byte about once, each read bounded, damaged spans healed from other copies."""

from __future__ import annotations

import os
import random
from pathlib import Path

from backup_helpers import CountingBucket

from lnk.backup import Repository, SnapshotReader, SnapshotWriter
from lnk.backup import reader as R
from lnk.backup.pack import pack_key
from lnk.formats.keys import ReceiverKey
from lnk.transport.buckets import Bucket


class Ranges(CountingBucket):
    """Records every read: whole objects and ranges."""

    def __init__(self, inner: Bucket) -> None:
        super().__init__(inner)
        self.whole: list[str] = []
        self.ranges: list[tuple[str, int, int]] = []

    def get(self, key: str) -> bytes:
        self.whole.append(key)
        return super().get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        data = super().get_range(key, start, length)
        self.ranges.append((key, start, len(data)))  # what came back
        return data

    def pack_bytes_read(self) -> int:
        return sum(n for k, _s, n in self.ranges if k.startswith("data/"))

    def reset(self) -> None:
        super().reset()
        self.whole.clear()
        self.ranges.clear()


def files(n: int, seed: int = 7) -> dict[str, bytes]:
    rng = random.Random(seed)
    out = {
        f"src/{i // 100:03d}/f{i:05d}.txt": rng.randbytes(rng.randint(0, 9000)) for i in range(n)
    }
    out["big/a.bin"] = os.urandom(5 * (1 << 20) + 17)  # six chunks
    out["big/b.bin"] = out["src/000/f00001.txt"] * 3  # a few KiB
    return out


def backup(repo: Repository, content: dict[str, bytes], tmp: Path) -> str:
    with SnapshotWriter(repo) as w:
        for rel, data in content.items():
            p = tmp / "one"
            p.write_bytes(data)
            with open(p, "rb") as f:
                w.add_file(rel, 0o644, f)
        return w.commit({"agent": "ada"})


def made(tmp_path: Path, owner: ReceiverKey) -> tuple[Path, Ranges, Repository]:
    """A repository in a local folder, every read of it recorded."""
    root = tmp_path / "repo"
    root.mkdir()
    bucket = Ranges(CountingBucket(_local(root)))
    return root, bucket, Repository.init(bucket, owner.public_key_text())


def packs_size(bucket: Bucket) -> int:
    return sum(size for _k, size in bucket.list("data/"))


def test_a_read_ahead_reads_each_pack_byte_about_once_and_no_pack_whole(
    tmp_path: Path, owner: ReceiverKey
) -> None:
    _root, bucket, repo = made(tmp_path, owner)
    content = files(3000)
    snap = backup(repo, content, tmp_path)
    bucket.reset()
    reader = SnapshotReader(Repository.open(bucket, receiver_key=owner), snap)
    got = {e.path: b"".join(parts) for e, parts in reader.read_ahead(reader.entries())}
    assert got == content
    assert not [k for k in bucket.whole if k.startswith("data/")]
    data = [(k, s, n) for k, s, n in bucket.ranges if k.startswith("data/")]
    heads = [r for r in data if r[1] == 0]
    spans = [r for r in data if r not in heads]
    assert spans and all(n <= R.SPAN_MAX for _k, _s, n in spans)
    # one header read per pack, and the blobs' bytes about once (headers and gaps aside)
    assert len(heads) == len({k for k, _s, _n in data})
    assert sum(n for _k, _s, n in spans) <= 1.02 * packs_size(bucket)


def test_reading_in_order_outside_the_read_ahead_reads_each_byte_about_once(
    tmp_path: Path, owner: ReceiverKey
) -> None:
    _root, bucket, repo = made(tmp_path, owner)
    content = files(2000, seed=3)
    snap = backup(repo, content, tmp_path)
    bucket.reset()
    reader = SnapshotReader(Repository.open(bucket, receiver_key=owner), snap)
    got = {e.path: b"".join(reader.open(e)) for e in reader.entries()}
    assert got == content
    assert not [k for k in bucket.whole if k.startswith("data/")]
    # the tree's span and the file's span are both kept: no pack byte read twice over
    assert bucket.pack_bytes_read() <= 1.5 * packs_size(bucket) + 10 * R.SPAN_MAX


def test_a_damaged_span_is_read_from_another_copy(tmp_path: Path, owner: ReceiverKey) -> None:
    """Half of a pack cut off: the blobs past the cut come from the copies a later
    backup stored (after a verify marked the pack damaged), the ones before from it."""
    from lnk.backup import verify

    root, bucket, repo = made(tmp_path, owner)
    content = files(1500, seed=11)
    snap = backup(repo, content, tmp_path)
    packs = sorted(k for k, _n in bucket.list("data/"))
    victim = max(packs, key=lambda k: (root / k).stat().st_size)
    body = (root / victim).read_bytes()
    (root / victim).write_bytes(body[: len(body) // 2])
    report = verify(Repository.open(bucket, receiver_key=owner), record=True)
    assert report.damaged == [victim.rsplit("/", 1)[1]]
    backup(Repository.open(bucket, receiver_key=owner), content, tmp_path)  # stores anew
    reader = SnapshotReader(Repository.open(bucket, receiver_key=owner), snap)
    got = {e.path: b"".join(parts) for e, parts in reader.read_ahead(reader.entries())}
    assert got == content
    assert pack_key(victim.rsplit("/", 1)[1]) == victim


def _local(root: Path) -> Bucket:
    from lnk.transport.buckets import open_bucket

    return open_bucket(f"file://{root}")
