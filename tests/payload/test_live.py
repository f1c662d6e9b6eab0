"""Files that change while the agent is sent: normal in a bulk, settled in the final.

A real writer process appends to a log, replaces a file by rename and writes a
SQLite database in WAL mode while the bulk goes; it stops (the agent is
paused), the final goes, and the destination holds exactly what the source
held at the pause.  No test here times anything.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from payload_helpers import (
    collections_of,
    files_but_writer_db,
    load_agent,
    make_agent,
    prepare,
    receive_bytes,
    send_bytes,
    start_writer,
    write,
    writer_rows,
)

from lnk.agents.layout import Machine
from lnk.errors import StreamError
from lnk.payload import pinned as P
from lnk.payload import reading as R
from lnk.payload import send_files as S


@pytest.mark.parametrize("rounds", [3])
def test_a_running_agent_moves_bulk_then_final(src: Machine, dst: Machine, rounds: int) -> None:
    a = make_agent(src)
    home = a.folders.home
    write(home / "agent.log", os.urandom(3 << 20))  # big: hashed, then read again to send
    for i in range(200):
        write(home / "src" / f"m{i // 20}" / f"f{i}.py", os.urandom(100 + i * 37))
    stop = src.home / "stop"
    for n in range(rounds):
        stop.unlink(missing_ok=True)
        # a log line every ms, a file replaced by rename every 10, a database row every 5
        writer = start_writer(home, stop, 0.001, 10, 5)
        try:
            r = prepare(dst, a.id if n else None)
            bulk, brep = send_bytes(a, r, phase="bulk")
            assert receive_bytes(dst, r, bulk).phase == "bulk"
        finally:
            stop.touch()  # the agent is paused: nothing writes any more
            assert writer.wait(30) == 0
        final, _ = send_bytes(
            a,
            r,
            phase="final",
            since=brep.watermarks,
            base_stream=brep.stream_id,
            inventory=r.inventory(),
        )
        rep = receive_bytes(dst, r, final)
        assert rep.committed
        b = load_agent(dst)
        assert files_but_writer_db(b.folders.root) == files_but_writer_db(a.folders.root)
        assert writer_rows(b.folders.home / "state.db") == writer_rows(home / "state.db")
        assert collections_of(b) == collections_of(a)
        # the destination's copy goes before the next round (a move back would replace it)
        from lnk.agents import registry

        registry.remove(dst, b, keep_files=False)


def _never_settles(name: str) -> Any:
    real = R.same_stat

    def same(x: os.stat_result, y: os.stat_result) -> bool:
        return False if x.st_ino == os.lstat(name).st_ino else real(x, y)

    return same


def test_a_file_that_never_settles_fails_a_one_phase_send_naming_it(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_agent(src)
    write(a.folders.home / "ok.txt", b"fine\n")
    log = write(a.folders.home / "logs" / "busy.log", b"busy\n" * 100)
    monkeypatch.setattr(R, "same_stat", _never_settles(str(log)))
    r = prepare(dst)
    with pytest.raises(StreamError, match=r"Home/logs/busy\.log kept changing"):
        send_bytes(a, r)
    with pytest.raises(StreamError, match=r"Home/logs/busy\.log kept changing"):
        send_bytes(a, r, phase="final")


def test_a_file_that_never_settles_is_unsettled_in_a_bulk_and_settled_in_the_final(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_agent(src)
    write(a.folders.home / "ok.txt", b"fine\n")
    log = write(a.folders.home / "busy.log", b"busy\n" * 100)
    monkeypatch.setattr(R, "same_stat", _never_settles(str(log)))
    r = prepare(dst)
    bulk, brep = send_bytes(a, r, phase="bulk")
    assert brep.unsettled == ["Home/busy.log"]
    receive_bytes(dst, r, bulk)
    monkeypatch.undo()  # paused: it holds still
    write(log, b"the last word\n")
    final, _ = send_bytes(
        a,
        r,
        phase="final",
        since=brep.watermarks,
        base_stream=brep.stream_id,
        inventory=r.inventory(),
    )
    assert receive_bytes(dst, r, final).committed
    assert (load_agent(dst).folders.home / "busy.log").read_bytes() == b"the last word\n"


def test_a_big_file_changed_between_its_hash_and_its_bytes(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bulk goes on (the receiver keeps nothing of it); a one-phase send fails naming it."""
    a = make_agent(src)
    big = write(a.folders.home / "big.bin", os.urandom(2 << 20))
    write(a.folders.home / "small.txt", b"small\n")
    real = S.read_settled

    def read_then_change(path: Path, keep: bool, tries: int = S.SETTLE_TRIES, **kw: Any) -> Any:
        got = real(path, keep, tries, **kw)
        if Path(path) == big:
            with open(big, "r+b") as f:
                f.write(os.urandom(64))  # rewritten in place
        return got

    monkeypatch.setattr(S, "read_settled", read_then_change)
    monkeypatch.setattr(R, "read_settled", read_then_change)
    r = prepare(dst)
    bulk, brep = send_bytes(a, r, phase="bulk")
    assert brep.unsettled == ["Home/big.bin"]
    assert receive_bytes(dst, r, bulk).phase == "bulk"
    assert not any(p.stat().st_size > 1 << 20 for p in r.objects.iterdir())  # nothing kept
    with pytest.raises(StreamError, match=r"Home/big\.bin changed while it was being sent"):
        send_bytes(a, prepare(dst))
    monkeypatch.undo()
    final, _ = send_bytes(
        a,
        r,
        phase="final",
        since=brep.watermarks,
        base_stream=brep.stream_id,
        inventory=r.inventory(),
    )
    assert receive_bytes(dst, r, final).committed
    assert (load_agent(dst).folders.home / "big.bin").read_bytes() == big.read_bytes()


def test_a_file_gone_before_it_is_read_is_not_sent(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_agent(src)
    gone = write(a.folders.home / "tmp.part", b"partial\n")
    write(a.folders.home / "kept.txt", b"kept\n")
    real = S.read_settled

    def vanish(path: Path, keep: bool, tries: int = S.SETTLE_TRIES, **kw: Any) -> Any:
        if Path(path) == gone:
            gone.unlink(missing_ok=True)
        return real(path, keep, tries, **kw)

    monkeypatch.setattr(S, "read_settled", vanish)
    monkeypatch.setattr(R, "read_settled", vanish)
    r = prepare(dst)
    data, rep = send_bytes(a, r)
    assert rep.vanished == 1
    assert receive_bytes(dst, r, data).committed
    home = load_agent(dst).folders.home
    assert (home / "kept.txt").read_bytes() == b"kept\n" and not (home / "tmp.part").exists()


@pytest.mark.parametrize("size", [100, 3 << 20], ids=["small", "big"])
def test_a_fifo_swapped_in_during_the_send_neither_blocks_it_nor_is_sent(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """Nobody writes the fifo: a blocking open would hang the send (issue 18); the send
    opens every file it reads without blocking, as the backup does, and leaves it out."""
    a = make_agent(src)
    victim = write(a.folders.home / "victim.bin", b"v" * size)
    write(a.folders.home / "kept.txt", b"kept\n")
    real = R.open_file

    def swap_then_open(path: str | Path) -> int:
        if Path(path) == victim and victim.is_file():
            victim.unlink()
            os.mkfifo(victim)
        return real(path)

    monkeypatch.setattr(R, "open_file", swap_then_open)
    monkeypatch.setattr(P, "open_file", swap_then_open)  # an agent's files
    monkeypatch.setattr(S, "open_file", swap_then_open)
    r = prepare(dst)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(send_bytes(a, r, phase="bulk")), daemon=True)
    t.start()
    t.join(60)  # a bound, not a timing: a blocked open never comes back
    assert not t.is_alive(), "the send blocked on a fifo"
    data, _ = out[0]
    assert receive_bytes(dst, r, data) is not None
    staged = list(r.dir.rglob("victim.bin"))
    assert all(p.is_file() and not stat.S_ISFIFO(p.lstat().st_mode) for p in staged)


@pytest.mark.parametrize("size", [0, 1, 4999, 65536, 65537, 300_000])
def test_a_file_read_in_short_pieces_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """A read may return fewer bytes than asked before the end (a FUSE file system, say):
    only a short read once the file's stat size is read ends the reading."""
    data = os.urandom(size)
    f = tmp_path / "f.bin"
    f.write_bytes(data)
    real = os.read
    monkeypatch.setattr(R.os, "read", lambda fd, n: real(fd, min(n, 1000)))
    got = R.read_settled(f, keep=True)
    assert got is not None and got.settled
    assert got.data == data
    assert got.sha == hashlib.sha256(data).hexdigest()


def test_a_file_that_grows_between_its_stat_and_its_read_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "f.txt"
    f.write_bytes(b"first\n")
    real = os.read
    grown: list[int] = []

    def read(fd: int, n: int) -> bytes:
        out = real(fd, n)
        if not grown:  # a writer appends once the first read is done
            grown.append(1)
            with f.open("ab") as w:
                w.write(b"second\n")
        return out

    monkeypatch.setattr(R.os, "read", read)
    got = R.read_settled(f, keep=True)
    assert got is not None and got.settled
    assert got.data == b"first\nsecond\n"


def _walked(tmp_path: Path, data: bytes) -> tuple[Path, os.stat_result]:
    """A file as a walk finds it: under the agent's folder, with its lstat."""
    (tmp_path / "Home").mkdir(exist_ok=True)
    f = tmp_path / "Home" / "f.txt"
    f.write_bytes(data)
    return f, os.lstat(f)


def test_a_walked_small_file_unchanged_is_read_with_one_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk's lstat stands for the stat before the read: one fstat, after it."""
    f, st = _walked(tmp_path, b"hello\n")
    real, calls = os.fstat, []
    monkeypatch.setattr(os, "fstat", lambda fd: calls.append(fd) or real(fd))
    got = R.read_settled(f, keep=True, rel="Home/f.txt", st=st)
    assert got is not None and got.settled and got.data == b"hello\n"
    assert got.sha == hashlib.sha256(b"hello\n").hexdigest()
    assert len(calls) == 1


@pytest.mark.parametrize("change", ["grown", "rewritten", "replaced", "fifo", "short reads"])
def test_a_walked_file_changed_since_its_walk_is_read_as_it_is_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """What the one-go read cannot vouch for is read the long way: never a file's old
    size of new bytes, never more than its walked size from whatever is opened."""
    f, st = _walked(tmp_path, b"0123456789")
    now: bytes | None = b"0123456789"
    if change == "grown":
        now = b"0123456789" + b"x" * 100_000
        with f.open("ab") as w:
            w.write(now[10:])
    elif change == "rewritten":  # same inode and size, other bytes, a later ctime
        now = b"abcdefghij"
        os.utime(f, ns=(1, 1))
        with f.open("r+b") as w:
            w.write(now)
    elif change == "replaced":  # an editor's save: another inode at the path
        now = b"new file"
        (tmp_path / "Home" / "tmp").write_bytes(now)
        os.rename(tmp_path / "Home" / "tmp", f)
    elif change == "fifo":
        now = None
        f.unlink()
        os.mkfifo(f)
    else:
        real = os.read
        monkeypatch.setattr(R.os, "read", lambda fd, n: real(fd, min(n, 3)))
    asked: list[int] = []
    real_read = R.os.read
    monkeypatch.setattr(R.os, "read", lambda fd, n: asked.append(n) or real_read(fd, n))
    got = R.read_settled(f, keep=True, rel="Home/f.txt", st=st)
    if now is None:
        assert got is None
        return
    assert got is not None and got.settled and got.data == now
    assert got.sha == hashlib.sha256(now).hexdigest()
    assert asked[0] == 11  # the one-go read: at most the walked size and one byte
    assert len(asked) > 1  # then the long way
