"""The backup's second process for small chunks (lnk.backup.sealer): real child
processes, killed with SIGKILL where the test says so."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
import zstandard
from backup_helpers import CountingBucket

from lnk.backup import Repository, SnapshotReader, SnapshotWriter, crypto, sealer
from lnk.backup.pack import aad_of
from lnk.formats.keys import ReceiverKey
from lnk.transport.buckets import open_bucket
from tests.procs import process_runs, wait_gone


def opened(key: bytes, repo_id: bytes, kind: str, blob_id: bytes, sealed: bytes) -> bytes:
    plain = crypto.decrypt(key, sealed, aad_of(repo_id, kind, blob_id), "a blob")
    return zstandard.ZstdDecompressor().decompress(plain[1:]) if plain[0] == 1 else plain[1:]


def batches(n: int, seed: int = 1) -> list[sealer.Batch]:
    rng = random.Random(seed)
    out = []
    for b in range(n):
        items = []
        for i in range(rng.randint(1, 40)):
            data = rng.choice([rng.randbytes(rng.randint(0, 5000)), b"abc" * rng.randint(0, 900)])
            items.append((rng.choice(["data", "tree"]), bytes([b % 256, i]) * 16, data))
        out.append(items)
    return out


def test_batches_come_back_sealed_in_order() -> None:
    key, repo_id = os.urandom(32), os.urandom(16)
    proc = sealer.SealProcess(key, repo_id)
    work = batches(60)
    futs = [proc.submit(b) for b in work]
    try:
        for batch, fut in zip(work, futs, strict=True):
            got = fut.result(timeout=30)
            assert [i for i, _s in got] == [i for _k, i, _d in batch]
            for (kind, i, data), (_i, sealed) in zip(batch, got, strict=True):
                assert sealed is not None
                assert opened(key, repo_id, kind, i, sealed) == data
        assert not proc.broken  # the child sealed them
    finally:
        proc.close()
    assert not process_runs(proc.pid)


def test_a_killed_child_leaves_its_batches_sealed_here() -> None:
    key, repo_id = os.urandom(32), os.urandom(16)
    proc = sealer.SealProcess(key, repo_id)
    work = batches(40, seed=2)
    futs = [proc.submit(b) for b in work[:20]]
    futs[0].result(timeout=30)
    os.kill(proc.pid, signal.SIGKILL)
    futs += [proc.submit(b) for b in work[20:]]
    try:
        for batch, fut in zip(work, futs, strict=True):
            got = fut.result(timeout=30)
            for (kind, i, data), (_i, sealed) in zip(batch, got, strict=True):
                assert sealed is not None and opened(key, repo_id, kind, i, sealed) == data
        assert proc.broken
    finally:
        proc.close()


def test_batches_sealed_here_from_two_threads_at_once() -> None:
    """Once the child is gone its unanswered batches are sealed on the reading thread
    while later ones are sealed on the submitting threads: one compressor, taken in turn
    (at once, zstd aborted the whole process)."""
    import threading

    key, repo_id = os.urandom(32), os.urandom(16)
    proc = sealer.SealProcess(key, repo_id)
    os.kill(proc.pid, signal.SIGKILL)
    work = batches(120, seed=7)
    results: dict[int, sealer.Sealed] = {}

    def submit(start: int) -> None:
        for n in range(start, len(work), 2):
            results[n] = proc.submit(work[n]).result(timeout=60)

    threads = [threading.Thread(target=submit, args=(i,)) for i in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        proc.close()
    assert proc.broken and sorted(results) == list(range(len(work)))
    for n, batch in enumerate(work):
        for (kind, i, data), (_i, sealed) in zip(batch, results[n], strict=True):
            assert sealed is not None and opened(key, repo_id, kind, i, sealed) == data


def test_the_child_ends_when_the_backup_dies(tmp_path: Path) -> None:
    """A backup killed with SIGKILL leaves no sealing process behind (its pipe closes)."""
    import subprocess
    import sys

    code = (
        "import os, sys, time; from lnk.backup import sealer; "
        "p = sealer.SealProcess(os.urandom(32), b'r' * 16); "
        "print(p.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=Path(__file__).parents[2]
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert process_runs(child)
    parent.kill()
    parent.wait()
    assert wait_gone(child, 20)


def small_files(n: int, seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {f"d{i // 50}/f{i}.txt": rng.randbytes(rng.randint(1, 3000)) for i in range(n)}


@pytest.mark.parametrize("kill", [False, True])
def test_a_backup_through_the_second_process_restores_the_same(
    tmp_path: Path, owner: ReceiverKey, monkeypatch: pytest.MonkeyPatch, kill: bool
) -> None:
    monkeypatch.setattr(sealer, "START_AFTER", 0)
    monkeypatch.setattr("lnk.backup.packer.BATCH_ITEMS", 16)  # many batches
    started: list[sealer.SealProcess] = []
    real_submit = sealer.SealProcess.submit

    def submit(self: sealer.SealProcess, batch: sealer.Batch) -> object:
        if self not in started:
            started.append(self)
        if kill and len(started) == 1 and not self.broken:
            kill_after = getattr(self, "_n", 0)
            self._n = kill_after + 1  # type: ignore[attr-defined]
            if kill_after == 5:
                os.kill(self.pid, signal.SIGKILL)
        return real_submit(self, batch)

    monkeypatch.setattr(sealer.SealProcess, "submit", submit)
    root = tmp_path / "repo"
    root.mkdir()
    bucket = CountingBucket(open_bucket(f"file://{root}"))
    repo = Repository.init(bucket, owner.public_key_text())
    content = small_files(600, seed=5 + kill)
    with SnapshotWriter(repo) as w:
        for rel, data in content.items():
            p = tmp_path / "one"
            p.write_bytes(data)
            with open(p, "rb") as f:
                w.add_file(rel, 0o644, f)
        snap = w.commit({"agent": "ada"})
    assert len(started) == 1
    assert started[0].broken == kill
    assert not process_runs(started[0].pid)
    reader = SnapshotReader(Repository.open(bucket, receiver_key=owner), snap)
    got = {e.path: b"".join(parts) for e, parts in reader.read_ahead(reader.entries())}
    assert got == content
