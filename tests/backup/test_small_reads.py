"""Small files read, hashed, named and sealed by the second process
(lnk/backup/small_reads.py, read_ahead.py): each answer as the backup's thread would
have read the file, real files and a real child process, killed where the test says
so; a backup through it restores the same agent, with files changed between the walk
and the read."""

from __future__ import annotations

import hashlib
import os
import signal
import struct
from concurrent.futures import Future
from pathlib import Path

import pytest
import zstandard
from bk_helpers import age, agent_files, give_keys, sample_agent, write

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup import crypto, sealer
from lnk.backup import read_ahead as RA
from lnk.backup import small_reads as S
from lnk.backup.agent import backup_agent
from lnk.backup.agent_restore import restore_agent
from lnk.backup.file_reads import FileSaver
from lnk.backup.filecache import ChunkCache
from lnk.backup.pack import aad_of, blob_name
from lnk.backup.read_ahead import ReadAhead
from lnk.payload.walk import SQLITE_MAGIC, WalkedFile
from tests.procs import process_runs

KEY, DEDUP, REPO = bytes(range(32)), bytes(range(32, 64)), b"r" * 16
STEP = 4096


def sealing() -> S.Sealing:
    return S.Sealing(crypto.aead(KEY), zstandard.ZstdCompressor(level=3), REPO, DEDUP, STEP)


def opened(blob_id: bytes, sealed: bytes) -> bytes:
    plain = crypto.decrypt(KEY, sealed, aad_of(REPO, "data", blob_id), "a blob")
    return zstandard.ZstdDecompressor().decompress(plain[1:]) if plain[0] == 1 else plain[1:]


def kinds_of_files(tmp_path: Path) -> dict[str, bytes]:
    """One path of each kind the process may be asked, and what it holds (b"" if none)."""
    data = b"print('hello')\n" * 40
    write(tmp_path / "plain.py", data)
    write(tmp_path / "empty", b"")
    write(tmp_path / "big", b"x" * STEP)  # a chunk or more: not small
    write(tmp_path / "db", SQLITE_MAGIC + b"\0" * 100)
    os.symlink("plain.py", tmp_path / "link")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    return {"plain.py": data, "empty": b""}


EXPECTED = {
    "plain.py": S.READ,
    "empty": S.READ,
    "big": S.OTHER,
    "db": S.OTHER,
    "link": S.GONE,
    "fifo": S.GONE,
    "dir": S.GONE,
    "missing": S.GONE,
}


def check(tmp_path: Path, name: str, r: S.SmallRead, content: dict[str, bytes]) -> None:
    assert r.status == EXPECTED[name], name
    if r.status != S.READ:
        assert (r.sha, r.blob_id, r.sealed, r.st) == (b"", b"", b"", None)
        return
    data = content[name]
    assert r.sha == hashlib.sha256(data).digest()
    st = os.lstat(tmp_path / name)
    assert r.st is not None
    assert (r.st.st_size, r.st.st_mtime_ns, r.st.st_ctime_ns, r.st.st_ino, r.st.st_mode) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
        st.st_mode,
    )
    assert r.t0 >= st.st_mtime_ns
    if data:
        assert r.blob_id == blob_name(DEDUP, "data", data)
        assert opened(r.blob_id, r.sealed) == data
    else:
        assert (r.blob_id, r.sealed) == (b"", b"")


def test_each_kind_of_path_is_answered_as_the_backup_would_read_it(tmp_path: Path) -> None:
    content = kinds_of_files(tmp_path)
    for name in EXPECTED:
        r = S.read_small(os.fsencode(tmp_path / name), sealing())
        check(tmp_path, name, r, content)
        # and comes through the pipe's encoding unchanged
        body = S.encode(r)
        back, end = S.decode(body, 0)
        assert end == len(body) and back == r


@pytest.mark.parametrize(
    "body",
    [
        b"\x07",  # no such status
        b"\x00" + b"\0" * 20,  # cut short in its head
        S.encode(S.SmallRead(S.READ, b"s" * 32, b"i" * 32, b"x" * 10, os.stat("/"), 1))[:-1],
    ],
)
def test_an_answer_that_is_not_one_is_refused(body: bytes) -> None:
    with pytest.raises((ValueError, struct.error, IndexError)):
        S.decode(body, 0)


@pytest.mark.parametrize("kill", [False, True])
def test_the_process_reads_them_or_they_are_read_here_once_it_is_gone(
    tmp_path: Path, kill: bool
) -> None:
    content = kinds_of_files(tmp_path)
    paths = [os.fsencode(tmp_path / n) for n in EXPECTED]
    proc = sealer.SealProcess(KEY, REPO, 3, DEDUP, STEP)
    try:
        first = proc.read(paths).result(timeout=30)
        if kill:
            os.kill(proc.pid, signal.SIGKILL)
        later = [proc.read(paths[i : i + 3]) for i in range(0, len(paths), 3)]
        rest = [r for f in later for r in f.result(timeout=30)]
        assert proc.broken == kill
    finally:
        proc.close()
    assert not process_runs(proc.pid)
    for got in (first, rest):
        for name, r in zip(EXPECTED, got, strict=True):
            check(tmp_path, name, r, content)


def big_source(a: registry.Agent) -> None:
    for d in range(4):
        for i in range(9):
            write(a.folders.home / "src" / f"pkg{d}" / f"m{i}.py", f"x = {d * 10 + i}\n".encode())
    for i in range(30):
        write(a.folders.home / "notes" / f"n{i}.md", f"note {i}\n".encode() * (i + 1))
    age(a)


@pytest.mark.parametrize("kill", [False, True])
def test_a_backup_read_by_the_second_process_restores_the_same_agent(
    src: Machine,
    dst: Machine,
    local_url: str,
    read_ahead_at_once: list[int],
    monkeypatch: pytest.MonkeyPatch,
    kill: bool,
) -> None:
    a = sample_agent(src)
    big_source(a)
    if kill:  # the process is killed after its first request: the rest is read here
        real = sealer.SealProcess.read
        killed: list[sealer.SealProcess] = []

        def read(self: sealer.SealProcess, paths: sealer.Paths) -> object:
            fut = real(self, paths)
            if not killed:
                killed.append(self)
                fut.result(timeout=30)  # type: ignore[attr-defined]
                os.kill(self.pid, signal.SIGKILL)
            return fut

        monkeypatch.setattr(sealer.SealProcess, "read", read)
    rep = backup_agent(src, a, local_url)
    if kill:
        assert killed and killed[0].broken
    assert sum(read_ahead_at_once) >= 60  # most of the files went through it
    give_keys(src, dst)
    restore_agent(dst, "work", local_url)
    b = registry.find(dst, "work")
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
    # what it read is remembered as what the backup's thread reads is: nothing new next
    again = backup_agent(src, a, local_url)
    assert again.new_blobs == 0 and again.snapshot != rep.snapshot


def test_files_changed_between_the_walk_and_the_read(
    src: Machine,
    dst: Machine,
    local_url: str,
    read_ahead_at_once: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file swapped for a link after the walk is left out (never followed); one that
    grew past a chunk is read by the backup's thread, whole; one rewritten is stored as
    read."""
    a = sample_agent(src)
    big_source(a)
    h = a.folders.home
    real = FileSaver.readable
    done: set[str] = set()

    def readable(self: FileSaver, f: object) -> bytes | None:
        path = real(self, f)  # type: ignore[arg-type]
        rel = getattr(f, "rel", "")
        if path is not None and rel not in done:
            done.add(rel)
            if rel == "Home/notes/n3.md":
                os.unlink(h / "notes" / "n3.md")
                os.symlink("/etc/passwd", h / "notes" / "n3.md")
            elif rel == "Home/notes/n4.md":
                write(h / "notes" / "n4.md", b"grown " * 300_000)
            elif rel == "Home/notes/n5.md":
                write(h / "notes" / "n5.md", b"rewritten\n")
        return path

    monkeypatch.setattr(FileSaver, "readable", readable)
    backup_agent(src, a, local_url)
    assert {"Home/notes/n3.md", "Home/notes/n4.md", "Home/notes/n5.md"} <= done
    give_keys(src, dst)
    restore_agent(dst, "work", local_url)
    got = registry.find(dst, "work").folders.home / "notes"
    assert not (got / "n3.md").exists() and not (got / "n3.md").is_symlink()
    assert (got / "n4.md").read_bytes() == b"grown " * 300_000
    assert (got / "n5.md").read_bytes() == b"rewritten\n"
    assert (got / "n6.md").read_bytes() == b"note 6\n" * 7


class _Late(Future[list[S.SmallRead]]):
    """An answer not there until someone waits for it (then it comes): ``done()`` is
    False until :meth:`result` or the test's ``answer_all``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def answer(self) -> None:
        if not self.done():
            self.set_result([S.SmallRead(S.GONE) for _ in range(self.n)])

    def result(self, timeout: float | None = None) -> list[S.SmallRead]:
        self.answer()
        return super().result(timeout)


class _SlowReader:
    """A stand-in for the second process (the unit's only collaborator): its answers
    come when waited for, or in the bursts the test makes; it counts what was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[bytes], _Late]] = []

    def read(self, paths: list[bytes]) -> _Late:
        fut = _Late(len(paths))
        self.asked.append((list(paths), fut))
        return fut

    def answer_all(self) -> None:
        for _paths, fut in self.asked:
            fut.answer()


@pytest.mark.parametrize("size", [10, 300_000])
def test_the_read_ahead_hands_items_on_in_walk_order_within_its_bounds(size: int) -> None:
    """Files, folders and ends come out in the order walked, each file with its own
    answer; while answers wait, at most AHEAD items or AHEAD_BYTES of files (and the
    one that crossed it) are held."""
    reader = _SlowReader()
    out: list[tuple[str, S.SmallRead | None]] = []
    waiting_max = 0

    def handle(f: WalkedFile, r: S.SmallRead | None) -> None:
        out.append((f.rel, r))

    ahead = ReadAhead(
        lambda: reader,  # type: ignore[arg-type,return-value]
        lambda f: f.rel.encode() if f.kind == "f" else None,
        handle,
    )
    walked = []
    for i in range(5000):
        kind = "d" if i % 50 == 0 else "f"
        f = WalkedFile(f"Home/x{i}", kind, 0o644, size if kind == "f" else 0)
        walked.append(f)
        ahead.push(f)
        held = len(walked) - len(out)
        waiting_max = max(waiting_max, held)
        assert held <= RA.AHEAD
        assert sum(w.size for w in walked[len(out) :]) <= RA.AHEAD_BYTES + size
        if i % 3000 == 2999:
            reader.answer_all()  # answers come late, in bursts
    reader.answer_all()
    ahead.finish()
    assert [rel for rel, _ in out] == [f.rel for f in walked]
    for (rel, r), f in zip(out, walked, strict=True):
        assert (r is None) == (f.kind == "d"), rel
    asked = [p for paths, _ in reader.asked for p in paths]
    assert asked == [f.rel.encode() for f in walked if f.kind == "f"]
    # it did read ahead, as far as its bounds let it
    assert waiting_max >= min(RA.AHEAD - 1, RA.AHEAD_BYTES // size)


def test_a_file_the_chunk_cache_knows_is_looked_up_once(
    src: Machine, local_url: str, read_ahead_at_once: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a folder walked file by file (one file changed), each unchanged file is found
    in the chunk cache when the read-ahead asks whether to read it, and that answer is
    the one used: one lookup a file, not one there and one again when it is stored."""
    a = sample_agent(src)
    big_source(a)
    backup_agent(src, a, local_url)
    write(a.folders.home / "src" / "pkg1" / "m4.py", b"x = 'changed'\n")
    for i in range(6):  # new files first in the walk: the second process starts
        write(a.folders.home / "a-new" / f"n{i}.txt", f"new {i}\n".encode())
    read_ahead_at_once.clear()
    asked: list[str] = []
    real = ChunkCache.file

    def file(self: ChunkCache, rel: str, st: os.stat_result) -> object:
        asked.append(rel)
        return real(self, rel, st)

    monkeypatch.setattr(ChunkCache, "file", file)
    savers: list[FileSaver] = []
    real_init = FileSaver.__init__

    def init(self: FileSaver, *args: object, **kw: object) -> None:
        real_init(self, *args, **kw)  # type: ignore[arg-type]
        savers.append(self)

    monkeypatch.setattr(FileSaver, "__init__", init)
    rep = backup_agent(src, a, local_url)
    assert rep.new_blobs >= 1 and read_ahead_at_once  # it read ahead
    # every answer kept for the store was used by it: none held past the run
    assert savers and all(not s._hits for s in savers)
    unchanged = [f"Home/src/pkg1/m{i}.py" for i in range(9) if i != 4]
    assert set(unchanged) <= set(asked)  # walked file by file, found in the cache
    assert {rel: asked.count(rel) for rel in unchanged} == dict.fromkeys(unchanged, 1)
