"""A restore read by a second process (lnk.backup.restore_reader): real child
processes on every real bucket backend, killed with SIGKILL where the test says so."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from bk_helpers import agent_files, collections_of, give_keys, sample_agent, write

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.backup import restore_reader
from lnk.backup.agent import backup_agent
from lnk.backup.agent_restore import restore_agent
from lnk.backup.repository import Repository
from lnk.backup.restore_reader import ReaderProcess
from lnk.errors import BackupError, LnkError, Refused, StreamError
from lnk.payload import manifest as M
from lnk.transport.buckets import open_bucket
from tests.procs import process_runs, wait_gone

ROOT = Path(__file__).parents[2]


def _children(monkeypatch: pytest.MonkeyPatch) -> list[ReaderProcess]:
    """Every ReaderProcess started from now on (the restore starts its own)."""
    started: list[ReaderProcess] = []
    real = ReaderProcess.__init__

    def init(self: ReaderProcess, *a: object) -> None:
        real(self, *a)  # type: ignore[arg-type]
        started.append(self)

    monkeypatch.setattr(ReaderProcess, "__init__", init)
    return started


def _many_files(machine: Machine, n: int) -> None:
    a = registry.find(machine, "work")
    for i in range(n):
        write(a.folders.home / f"src/d{i // 40}/f{i}.py", f"print({i})\n".encode() * (i % 7 + 1))


def _backed_up(
    src: Machine, dst: Machine, url: str, monkeypatch: pytest.MonkeyPatch, min_files: int | None = 1
) -> Agent:
    """The sample agent backed up to ``url`` and the keys given to ``dst``; with
    ``min_files``, snapshots that big are read by a child."""
    if min_files is not None:
        monkeypatch.setattr(restore_reader, "MIN_FILES", min_files)
    a = sample_agent(src)
    backup_agent(src, a, url)
    give_keys(src, dst)
    return a


def _repo_id(url: str) -> str:
    return Repository.open(open_bucket(url)).id


def test_a_big_snapshot_is_read_by_a_second_process(
    src: Machine, dst: Machine, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(restore_reader, "MIN_FILES", 50)
    started = _children(monkeypatch)
    opened: list[int] = []  # chunks the child left in their zstd frames, opened here
    real_unzstd = ReaderProcess._unzstd

    def unzstd(self: ReaderProcess, frame: bytes) -> bytes:
        opened.append(len(frame))
        return real_unzstd(self, frame)

    monkeypatch.setattr(ReaderProcess, "_unzstd", unzstd)
    a = sample_agent(src, big=3 << 20)
    _many_files(src, 120)
    write(a.folders.home / "src" / "long.py", b"x = 1\n" * 20_000)  # compresses well
    backup_agent(src, registry.find(src, "work"), url)
    give_keys(src, dst)
    seen: list[int] = []
    rep = restore_agent(dst, "work", url, progress=seen.append)
    assert len(started) == 1  # through the child
    assert opened  # the two processes shared the opening of compressed chunks
    assert not process_runs(started[0].pid)  # and reaped
    b = registry.find(dst, "work")
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
    assert collections_of(b) == collections_of(a)
    assert rep.layout == 2 and rep.files >= 120
    assert sum(seen) >= 3 << 20  # the data's bytes counted as they came


def test_a_small_snapshot_is_read_here(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _children(monkeypatch)
    a = _backed_up(src, dst, local_url, monkeypatch, min_files=None)
    restore_agent(dst, "work", local_url)
    assert started == []
    assert agent_files(registry.find(dst, "work").folders.root) == agent_files(a.folders.root)


def test_a_reader_that_cannot_start_leaves_the_restore_to_this_process(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _backed_up(src, dst, local_url, monkeypatch)
    tried: list[object] = []

    def no_fork(*args: object, **kw: object) -> None:
        tried.append(args)
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(restore_reader.subprocess, "Popen", no_fork)
    restore_agent(dst, "work", local_url)
    assert len(tried) == 1
    assert agent_files(registry.find(dst, "work").folders.root) == agent_files(a.folders.root)


def test_restored_under_a_new_name_through_the_child(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _children(monkeypatch)
    a = _backed_up(src, dst, local_url, monkeypatch)
    rep = restore_agent(dst, "work", local_url, as_name="twin")
    assert len(started) == 1
    b = registry.find(dst, "twin")
    assert rep.agent == "twin" and b.settings.id != a.settings.id
    assert agent_files(b.folders.root) == agent_files(a.folders.root)


def _refused(child: ReaderProcess, kind: type[LnkError], text: str) -> None:
    """The child's first frame is its refusal: ``kind``, saying ``text``; then reaped."""
    try:
        with pytest.raises(kind) as e:
            child.head()
        assert text in e.value.message
    finally:
        child.close()


def test_the_child_refusing_is_one_clear_error(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child fails on its own (its HOME has no key): the parent raises its error."""
    _backed_up(src, dst, local_url, monkeypatch)
    snap = restore_agent(dst, "work", local_url).snapshot
    child = ReaderProcess(Machine(dst.home / "nobody"), local_url, _repo_id(local_url), snap)
    _refused(child, Refused, "backup key")
    assert not process_runs(child.pid)


def test_the_child_refuses_another_repository_than_the_one_opened(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bucket holds another repository by the time the child opens it (swapped between
    the restore's open and the child's): the child reads nothing of it."""
    _backed_up(src, dst, local_url, monkeypatch)
    snap = restore_agent(dst, "work", local_url).snapshot
    child = ReaderProcess(dst, local_url, "0" * 32, snap)
    _refused(child, BackupError, "is not the one this restore opened")


def test_a_killed_reader_leaves_nothing_applied(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(restore_reader, "MIN_FILES", 1)
    started = _children(monkeypatch)
    sample_agent(src, big=4 << 20)
    _many_files(src, 300)
    backup_agent(src, registry.find(src, "work"), local_url)
    give_keys(src, dst)

    def kill(_n: int) -> None:
        if process_runs(started[0].pid):
            os.kill(started[0].pid, signal.SIGKILL)

    with pytest.raises(BackupError) as e:
        restore_agent(dst, "work", local_url, progress=kill)
    assert "ended before the snapshot did; nothing was restored" in e.value.message
    assert registry.find_by_id(dst, registry.find(src, "work").settings.id) is None
    assert not (dst.settings_file("work")).exists()
    restore_agent(dst, "work", local_url)  # and a second try restores it whole
    assert agent_files(registry.find(dst, "work").folders.root) == agent_files(
        registry.find(src, "work").folders.root
    )


def _child_of(parent: int, deadline: float) -> int | None:
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"restore_reader" in cmd:
                return int(entry.name)
        time.sleep(0.01)
    return None


def test_a_killed_restore_leaves_nothing_applied_and_no_child(
    src: Machine, dst: Machine, local_url: str
) -> None:
    """``lnk agent restore`` killed with SIGKILL while its reader runs: the reader ends
    (its pipes close) and the destination holds no agent."""
    a = sample_agent(src)
    _many_files(src, restore_reader.MIN_FILES + 100)
    backup_agent(src, registry.find(src, "work"), local_url)
    give_keys(src, dst)
    env = os.environ | {"HOME": str(dst.home)}
    p = subprocess.Popen(
        [sys.executable, "-m", "lnk", "agent", "restore", "work", "--from", local_url],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    child = _child_of(p.pid, time.monotonic() + 60)
    assert child is not None
    os.kill(child, signal.SIGSTOP)  # the restore cannot get past the manifest meanwhile
    p.kill()
    p.wait()
    os.kill(child, signal.SIGCONT)
    assert wait_gone(child, 20)
    assert registry.find_by_id(dst, a.settings.id) is None
    restore_agent(dst, "work", local_url)  # nothing half-done stands in the way
    assert agent_files(registry.find(dst, "work").folders.root) == agent_files(
        registry.find(src, "work").folders.root
    )


# ---- what the parent accepts from the pipe -----------------------------------------
def _fed(data: bytes) -> ReaderProcess:
    r = ReaderProcess.__new__(ReaderProcess)
    r._from = io.BytesIO(data)
    r._dctx = zstandard.ZstdDecompressor()
    return r


def _frame(kind: int, body: bytes, n: int | None = None) -> bytes:
    return bytes((kind,)) + (len(body) if n is None else n).to_bytes(4, "big") + body


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (_frame(M.HEAD, b"", n=restore_reader.FRAME_MAX + 1), "not one of its frames"),
        (_frame(0x42, b"{}"), "not one of its frames"),
        (_frame(M.HEAD, b"{}")[:-1], "ended before the snapshot did"),
        (b"\x01\x00", "ended before the snapshot did"),
        (b"", "ended before the snapshot did"),
        (_frame(restore_reader.FAILED, b"not json"), "ended before the snapshot did"),
    ],
)
def test_frames_that_are_not_ours_stop_the_restore(data: bytes, says: str) -> None:
    with pytest.raises(BackupError) as e:
        _fed(data).head()
    assert says in e.value.message


def test_the_first_record_must_be_the_manifest() -> None:
    with pytest.raises(StreamError) as e:
        _fed(_frame(M.FILES, b"[]")).head()
    assert "first record is not its manifest" in e.value.message


def test_a_failure_longer_than_a_line_is_not_ours() -> None:
    body = json.dumps({"kind": "Refused", "message": "x" * restore_reader.FAILED_MAX})
    with pytest.raises(BackupError) as e:
        _fed(_frame(restore_reader.FAILED, body.encode())).head()
    assert "not one of its frames" in e.value.message


def test_a_failure_keeps_its_kind_and_hint() -> None:
    body = json.dumps({"kind": "Refused", "message": "no key here", "hint": "import it"})
    with pytest.raises(Refused) as e:
        _fed(_frame(restore_reader.FAILED, body.encode())).head()
    assert (e.value.message, e.value.hint) == ("no key here", "import it")
    body = json.dumps({"kind": "SystemExit", "message": "odd", "hint": None})
    with pytest.raises(BackupError) as e2:  # an unknown kind is a BackupError
        _fed(_frame(restore_reader.FAILED, body.encode())).head()
    assert e2.value.message == "odd"


def test_records_end_at_end_and_count_data() -> None:
    data = (
        _frame(M.FILES, b"[]")
        + _frame(M.DATA, b"abc")
        + _frame(M.DATA, b"de")
        + _frame(restore_reader.END, b"")
        + _frame(M.DATA, b"never read")
    )
    seen: list[int] = []
    got = list(_fed(data).records({"a": 1}, seen.append))
    assert got == [(M.HEAD, M.dump({"a": 1})), (M.FILES, b"[]"), (M.DATA, b"abc"), (M.DATA, b"de")]
    assert seen == [3, 2]


def test_chunks_left_compressed_are_opened_here_and_counted_as_their_bytes() -> None:
    plain = b"the same line again\n" * 500
    data = (
        _frame(restore_reader.DATA_ZSTD, zstandard.ZstdCompressor().compress(plain))
        + _frame(restore_reader.DATA_ZSTD, zstandard.ZstdCompressor().compress(b""))
        + _frame(restore_reader.END, b"")
    )
    seen: list[int] = []
    got = list(_fed(data).records({"a": 1}, seen.append))
    assert got[1:] == [(M.DATA, plain), (M.DATA, b"")]
    assert seen == [len(plain), 0]


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(b"not zstd at all", id="not-zstd"),
        pytest.param(zstandard.ZstdCompressor().compress(b"abc") + b"more", id="bytes-after"),
        pytest.param(zstandard.ZstdCompressor().compress(b"x" * 200), id="past-the-bound"),
        pytest.param(zstandard.ZstdCompressor().compress(b"abcdef" * 50)[:-3], id="cut-short"),
    ],
)
def test_a_compressed_chunk_that_is_not_one_bounded_frame_stops_the_restore(
    frame: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(restore_reader, "FRAME_MAX", 100)
    data = _frame(restore_reader.DATA_ZSTD, frame) + _frame(restore_reader.END, b"")
    with pytest.raises(BackupError) as e:
        list(_fed(data).records({"a": 1}))
    assert "not one zstd frame of the size it declares" in e.value.message


def test_a_compressed_chunk_that_does_not_declare_its_size_stops_the_restore() -> None:
    c = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    frame = c.compress(b"no size " * 100) + c.flush()
    assert zstandard.frame_content_size(frame) == -1
    data = _frame(restore_reader.DATA_ZSTD, frame) + _frame(restore_reader.END, b"")
    with pytest.raises(BackupError, match="not one zstd frame"):
        list(_fed(data).records({"a": 1}))
