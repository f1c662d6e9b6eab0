"""The backup repository against a local folder and moto S3."""

from __future__ import annotations

import io
import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from backup_helpers import CountingBucket

from lnk.backup import Repository, SnapshotReader, SnapshotWriter, prune, verify
from lnk.backup.reader import AGENT_FILE_LINE
from lnk.errors import AlreadyExists, BackupError, InvalidInput, Refused
from lnk.formats.keys import ReceiverKey

MiB = 1024 * 1024


def make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "notes.md": b"# notes\n" * 100,
        "chats/2026-11-30.jsonl": b'{"role":"user","text":"hi"}\n' * 5000,
        "work/big.bin": os.urandom(3 * MiB + 123),
        "work/empty": b"",
        "skills/a/SKILL.md": b"do things",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    os.chmod(root / "notes.md", 0o600)
    return files


def backup_folder(
    repo: Repository, root: Path, meta: dict[str, str] | None = None, when: datetime | None = None
) -> str:
    with SnapshotWriter(repo) as w:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    w.add_file(p.relative_to(root).as_posix(), p.stat().st_mode, f)
        w.add_blob("manifest", b'{"agent":"ada"}')
        return w.commit(meta or {"agent": "ada"}, time=when)


def test_round_trip(bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = make_tree(src)
    repo = Repository.init(bucket, owner.public_key_text())
    snap = backup_folder(repo, src)

    reader = SnapshotReader(Repository.open(bucket, receiver_key=owner), snap)
    names = [e.path for e in reader.entries()]
    assert set(names) == set(files) | {"manifest"}
    assert reader.read_blob("manifest") == b'{"agent":"ada"}'
    dest = tmp_path / "dest"
    assert reader.restore(dest) == len(files)
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data
    assert stat.S_IMODE((dest / "notes.md").stat().st_mode) == 0o600
    [info] = repo.list_snapshots()
    assert info.id == snap and info.meta == {"agent": "ada"} and info.files == len(files)
    assert verify(repo, read_data=True).ok


def test_names_reveal_nothing(bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path) -> None:
    import hashlib

    repo = Repository.init(bucket, owner.public)
    secret = b"the launch code is 1234 " * 1000
    with SnapshotWriter(repo) as w:
        w.add_file("secret.txt", 0o644, io.BytesIO(secret))
        w.commit()
    digest = hashlib.sha256(secret).hexdigest()
    keys = [k for k, _ in bucket.list()]
    assert all(digest not in k and "secret" not in k for k in keys)
    for k in keys:
        assert b"launch code" not in bucket.get(k)


def test_incremental_uploads_only_new_chunks(
    bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    make_tree(src)
    repo = Repository.init(bucket, owner.public)
    backup_folder(repo, src)
    first_bytes = bucket.put_bytes

    bucket.reset()
    backup_folder(repo, src)  # nothing changed
    # even the file list is the same blob: only the marker and the commit
    assert sorted(k.split("/")[0] for k in bucket.puts) == ["locks", "snapshots"]
    assert bucket.put_bytes < first_bytes // 20

    bucket.reset()
    with open(src / "chats/2026-11-30.jsonl", "ab") as f:
        f.write(b'{"role":"agent","text":"hello"}\n')
    (src / "new.txt").write_bytes(b"new file")
    snap = backup_folder(repo, src)
    assert len([k for k in bucket.puts if k.startswith("data/")]) == 1
    assert bucket.put_bytes < 64 * 1024  # the 3 MiB file was not sent again
    reader = SnapshotReader(repo, snap, owner)
    assert {e.path for e in reader.entries()} >= {"new.txt", "work/big.bin"}


def test_interrupted_backup_leaves_no_snapshot_and_is_reused(
    bucket: CountingBucket, owner: ReceiverKey
) -> None:
    repo = Repository.init(bucket, owner.public, pack_size=1 * MiB)
    data = os.urandom(5 * MiB)
    w = SnapshotWriter(repo)
    w.add_file("big", 0o644, io.BytesIO(data))  # packs are flushed as it goes
    w.sync()  # its full packs are in the bucket (the last one is still being filled)
    # the process dies here: no commit, no abort, the lock stays
    assert repo.list_snapshots() == []
    assert any(k.startswith("locks/") for k, _ in bucket.list())

    bucket.reset()
    repo2 = Repository.open(bucket, writer_secret=repo.writer_secret)
    with SnapshotWriter(repo2) as w2:
        w2.add_file("big", 0o644, io.BytesIO(data))
        snap = w2.commit()
    assert bucket.put_bytes < 2 * MiB  # at most the last, unflushed chunk again
    reader = SnapshotReader(Repository.open(bucket, receiver_key=owner), snap)
    [entry] = list(reader.entries())
    assert b"".join(reader.open(entry)) == data


def test_two_writers_at_once(bucket: CountingBucket, owner: ReceiverKey) -> None:
    repo = Repository.init(bucket, owner.public)
    a, b = SnapshotWriter(repo), SnapshotWriter(repo)
    a.add_file("a", 0o644, io.BytesIO(b"A" * 1000))
    b.add_file("b", 0o644, io.BytesIO(b"B" * 1000))
    sb = b.commit({"who": "b"})
    sa = a.commit({"who": "a"})
    full = Repository.open(bucket, receiver_key=owner)
    assert {s.id for s in full.list_snapshots()} == {sa, sb}
    assert [e.path for e in SnapshotReader(full, sa).entries()] == ["a"]
    assert [e.path for e in SnapshotReader(full, sb).entries()] == ["b"]
    assert verify(full, read_data=True).ok
    assert not any(k.startswith("locks/") for k, _ in bucket.list())


def test_verify_finds_missing_and_corrupted(
    bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    make_tree(src)
    repo = Repository.init(bucket, owner.public)
    backup_folder(repo, src)
    assert verify(repo).ok
    packs = sorted(k for k, _ in bucket.list("data/"))
    assert len(packs) >= 1

    victim = packs[0]
    body = bytearray(bucket.get(victim))
    body[len(body) // 2] ^= 0xFF
    bucket.put(victim, bytes(body))
    assert verify(repo).ok  # same size: only reading the data shows it
    report = verify(repo, read_data=True)
    assert not report.ok and any("corrupted" in p for p in report.problems)

    bucket.delete(victim)
    report = verify(repo)
    assert not report.ok and any("missing" in p for p in report.problems)


def test_wrong_key_cannot_read(bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path) -> None:
    repo = Repository.init(bucket, owner.public)
    with SnapshotWriter(repo) as w:
        w.add_file("f", 0o644, io.BytesIO(b"private"))
        snap = w.commit()
    stranger = ReceiverKey.generate()
    with pytest.raises(Refused):
        Repository.open(bucket, receiver_key=stranger)
    with pytest.raises(Refused):
        SnapshotReader(repo, snap, stranger)
    with pytest.raises(Refused):
        Repository.open(bucket, writer_secret=os.urandom(32))


def test_public_key_only_handle_writes_but_cannot_read(
    bucket: CountingBucket, owner: ReceiverKey, tmp_path: Path
) -> None:
    # the owner makes the repository; a box gets the public key and the writer secret
    made = Repository.init(bucket, owner.public_key_text())
    box = Repository.open(bucket, writer_secret=made.writer_secret)
    assert not box.can_read
    payload = os.urandom(200_000)
    with SnapshotWriter(box) as w:
        w.add_file("f", 0o644, io.BytesIO(payload))
        snap = w.commit({"from": "box"})
    assert [s.meta for s in box.list_snapshots()] == [{"from": "box"}]
    with pytest.raises(Refused):
        SnapshotReader(box, snap)
    # everything the box knows (master, dedup key, index key) opens no data:
    # the data key of its own run is sealed to the owner
    for key, _ in bucket.list("data/"):
        assert payload[:64] not in bucket.get(key)
    owner_repo = Repository.open(bucket, receiver_key=owner)
    reader = SnapshotReader(owner_repo, snap)
    [entry] = list(reader.entries())
    assert b"".join(reader.open(entry)) == payload


def test_init_twice_and_bad_paths(bucket: CountingBucket, owner: ReceiverKey) -> None:
    repo = Repository.init(bucket, owner.public)
    with pytest.raises(AlreadyExists):
        Repository.init(bucket, owner.public)
    with SnapshotWriter(repo) as w, pytest.raises(InvalidInput):
        w.add_file("../escape", 0o644, io.BytesIO(b"x"))
    assert not any(k.startswith("locks/") for k, _ in bucket.list())


def test_prune_keeps_what_the_policy_says(bucket: CountingBucket, owner: ReceiverKey) -> None:
    repo = Repository.init(bucket, owner.public)
    start = datetime(2026, 1, 1, 12, tzinfo=UTC)
    by_day: dict[int, str] = {}
    for day in range(0, 60, 3):  # a snapshot every third day for 60 days
        with SnapshotWriter(repo) as w:
            w.add_file("day", 0o644, io.BytesIO(f"day {day}".encode() * 50 + os.urandom(64)))
            by_day[day] = w.commit({"day": str(day)}, time=start + timedelta(days=day))
    packs_before = {k for k, _ in bucket.list("data/")}

    report = prune(repo, {"last": 2, "daily": 3, "monthly": 2}, min_age=timedelta(0))
    # newest first: days 57, 54, 51 (daily 3 and last 2), month 2 -> 57, month 1 -> 30
    expected = {by_day[d] for d in (57, 54, 51, 30)}
    assert set(report.kept) == expected
    assert {s.id for s in repo.list_snapshots()} == expected
    assert report.deleted_packs and not report.deferred
    assert {k for k, _ in bucket.list("data/")} < packs_before
    assert verify(repo, read_data=True).ok
    reader = SnapshotReader(Repository.open(bucket, receiver_key=owner), by_day[30])
    [entry] = list(reader.entries())
    assert b"".join(reader.open(entry)).startswith(b"day 30")


def test_prune_spares_a_running_backup(bucket: CountingBucket, owner: ReceiverKey) -> None:
    repo = Repository.init(bucket, owner.public, pack_size=MiB)
    with SnapshotWriter(repo) as w:
        w.add_file("old", 0o644, io.BytesIO(os.urandom(1000)))
        w.commit(time=datetime(2026, 1, 1, tzinfo=UTC))
    running = SnapshotWriter(repo)
    running.add_file("new", 0o644, io.BytesIO(os.urandom(3 * MiB)))
    running.sync()  # full packs uploaded, no commit
    packs = {k for k, _ in bucket.list("data/")}
    report = prune(repo, {"last": 1}, min_age=timedelta(0))
    assert report.deferred and report.deleted_packs == []
    assert {k for k, _ in bucket.list("data/")} == packs
    snap = running.commit()
    assert snap in {s.id for s in repo.list_snapshots()}
    assert verify(repo, read_data=True).ok

    # and without min_age=0, young unreferenced packs stay even with no backup running
    leftover = SnapshotWriter(repo)
    leftover.add_file("x", 0o644, io.BytesIO(os.urandom(2 * MiB)))
    leftover.abort()
    before = {k for k, _ in bucket.list("data/")}
    assert prune(repo, {"last": 1}).deleted_packs == []
    assert {k for k, _ in bucket.list("data/")} == before


def test_prune_rejects_bad_policies(bucket: CountingBucket, owner: ReceiverKey) -> None:
    repo = Repository.init(bucket, owner.public)
    with pytest.raises(InvalidInput):
        prune(repo, {"fortnightly": 2})
    with pytest.raises(InvalidInput):
        prune(repo, {"daily": 0})


def test_commit_fails_if_a_reused_pack_vanished(bucket: CountingBucket, owner: ReceiverKey) -> None:
    repo = Repository.init(bucket, owner.public)
    data = os.urandom(1000)
    with SnapshotWriter(repo) as w:
        w.add_file("f", 0o644, io.BytesIO(data))
        w.commit()
    w2 = SnapshotWriter(repo)
    w2.add_file("f", 0o644, io.BytesIO(data))  # deduped against the first pack
    for k, _ in list(bucket.list("data/")):
        bucket.delete(k)  # a concurrent prune
    with pytest.raises(BackupError):
        w2.commit()
    w2.abort()
    assert len(repo.list_snapshots()) == 1


def test_a_list_is_cut_where_its_lines_say_so_a_change_moves_no_later_cut() -> None:
    from lnk.backup.writer import line_cuts

    lines = [f'{{"p":"Home/src/f{i:06d}.py","s":{i * 7}}}\n'.encode() for i in range(60_000)]
    before = list(line_cuts(io.BytesIO(b"".join(lines)), MiB))
    lines[10] = b'{"p":"Home/src/a-longer-name-now.py","s":1}\n'
    after = list(line_cuts(io.BytesIO(b"".join(lines)), MiB))
    assert b"".join(after) == b"".join(lines)  # nothing lost, nothing added
    assert all(len(p) <= MiB for p in before + after)
    assert len(before) > 10
    assert len(set(after) - set(before)) == 1  # only the piece with the change is new
    # no line end in time: cut at the most, still whole
    long = b"x" * (3 * MiB) + b"\n"
    assert [len(p) for p in line_cuts(io.BytesIO(long), MiB)] == [MiB, MiB, MiB, 1]


def test_the_line_of_an_agent_file_is_known_to_readers_that_skip_it(
    bucket: CountingBucket, owner: ReceiverKey
) -> None:
    """A restore's first pass skips the agent's files by the writer's form of their line
    (read_parts): that form is the writer's, and only those lines are skipped."""
    repo = Repository.init(bucket, owner.public)
    with SnapshotWriter(repo) as w:
        w.add_bytes("agent/Home/a.txt", 0o644, b"a")
        assert w.last_line.startswith(AGENT_FILE_LINE)
        w.add_bytes("agentish/b", 0o644, b"b")
        assert not w.last_line.startswith(AGENT_FILE_LINE)
        w.add_blob("agent/blob", b"c")
        assert not w.last_line.startswith(AGENT_FILE_LINE)
        snap = w.commit({"agent": "ada"})
    reader = SnapshotReader(Repository.open(bucket, receiver_key=owner), snap)
    assert [e.path for e in reader.entries()] == ["agent/Home/a.txt", "agentish/b", "agent/blob"]
    assert [e.path for e in reader.entries(skip=AGENT_FILE_LINE)] == ["agentish/b", "agent/blob"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("chunk_size", 1 << 40),  # each "small" file read whole: a machine's memory
        ("chunk_size", 1 << 32),  # past the sealing process's u32
        ("chunk_size", 0),
        ("chunk_size", -1),
        ("chunk_size", "1048576"),
        ("chunk_size", True),
        ("chunk_size", 1.5),
        ("pack_size", 1 << 40),  # a pack is held whole before it goes
        ("pack_size", None),
    ],
)
def test_a_config_with_sizes_no_lnk_wrote_is_refused(
    bucket: CountingBucket, owner: ReceiverKey, key: str, value: object
) -> None:
    """The config is plaintext in the bucket: whoever can write there can change its
    sizes, and a writer would read and hold what they say. Refused, and nothing written."""
    Repository.init(bucket, owner.public)
    config = json.loads(bucket.get("config"))
    config[key] = value
    bucket.put("config", json.dumps(config).encode())
    before = sorted(k for k, _ in bucket.list())
    with pytest.raises(BackupError, match=f"config of .* is damaged: its {key} is not"):
        Repository.open(bucket, receiver_key=owner)
    assert sorted(k for k, _ in bucket.list()) == before
