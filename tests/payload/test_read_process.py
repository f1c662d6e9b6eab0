"""A send's small files read by child processes (lnk/payload/read_process.py): the same
files arrive as when its threads read them, a child's word is checked, and a child
that dies or lies costs nothing but its speed."""

from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from payload_helpers import load_agent, make_agent, prepare, receive_bytes, send_bytes, tree, write

from lnk.agents.layout import Machine
from lnk.payload import read_process as RP
from lnk.payload import reading as R


def _agent_of_many_files(src: Machine) -> Any:
    a = make_agent(src)
    h = a.folders.home
    for d in range(6):
        for i in range(60):
            write(h / f"src{d}" / f"f{i:02d}.py", f"print({d}, {i})\n".encode() * (i + 1))
    write(h / "empty", b"")
    write(h / "big.bin", os.urandom((1 << 20) + 5))  # past a small file: read as it goes
    os.link(h / "src0" / "f01.py", h / "hard.py")
    db = sqlite3.connect(h / "notes.db")  # told by its first bytes: snapshotted
    db.execute("CREATE TABLE t (x)")
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(50)])
    db.commit()
    db.close()
    return a


def _started(monkeypatch: pytest.MonkeyPatch) -> list[RP.ReadProcess]:
    """Children from the first job on; each one started, kept for the test to look at."""
    monkeypatch.setattr(R.Readers, "START_AFTER", 0)
    started: list[RP.ReadProcess] = []
    real = RP.ReadProcess.__init__

    def init(self: RP.ReadProcess) -> None:
        real(self)
        started.append(self)

    monkeypatch.setattr(RP.ReadProcess, "__init__", init)
    return started


def test_files_read_by_the_children_arrive_as_the_agent_holds_them(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _agent_of_many_files(src)
    started = _started(monkeypatch)
    asked: list[int] = []
    real_read = RP.ReadProcess.read
    monkeypatch.setattr(
        RP.ReadProcess, "read", lambda self, job: asked.append(len(job)) or real_read(self, job)
    )
    r = prepare(dst)
    data, rep = send_bytes(a, r)
    assert receive_bytes(dst, r, data).committed
    b = load_agent(dst)
    assert tree(b.folders.home, skip=["notes.db"]) == tree(a.folders.home, skip=["notes.db"])
    db = sqlite3.connect(b.folders.home / "notes.db")
    assert db.execute("SELECT COUNT(*) FROM t").fetchone() == (50,)
    db.close()
    assert started and sum(asked) > 300  # the children read the small files
    assert rep.hashed_bytes > 0
    for proc in started:  # and each ended with the send
        assert proc.broken and proc._proc.poll() is not None


def test_a_child_killed_mid_send_costs_nothing_but_its_speed(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _agent_of_many_files(src)
    started = _started(monkeypatch)
    real_read = RP.ReadProcess.read
    answered: list[object] = []
    killed: list[int] = []
    lock = threading.Lock()

    def read(self: RP.ReadProcess, job: RP.Job) -> Any:
        # the first job asked once two were answered (whichever of the two reading
        # threads asks it: each checks and notes under the lock, so neither can miss
        # the moment) goes to a child killed -9 as it goes
        with lock:
            kill = len(answered) >= 2 and not killed
            if kill:
                killed.append(self.pid)
        if kill:
            os.kill(self.pid, signal.SIGKILL)
        got = real_read(self, job)
        with lock:
            answered.append(got)
        return got

    monkeypatch.setattr(RP.ReadProcess, "read", read)
    r = prepare(dst)
    data, _ = send_bytes(a, r)
    assert receive_bytes(dst, r, data).committed
    b = load_agent(dst)
    assert tree(b.folders.home, skip=["notes.db"]) == tree(a.folders.home, skip=["notes.db"])
    assert killed  # (the send asked more than two jobs of the children)
    assert None in answered  # a job the dead child did not answer was read here
    assert any(p.broken for p in started)


def _job(*paths: Path) -> RP.Job:
    return [(os.fsencode(p), os.lstat(p)) for p in paths]


def test_the_child_answers_only_for_the_file_as_it_was_walked(tmp_path: Path) -> None:
    same = write(tmp_path / "same.txt", b"as walked\n")
    grown = write(tmp_path / "grown.txt", b"short\n")
    swapped = write(tmp_path / "swapped.txt", b"first\n")
    gone = write(tmp_path / "gone.txt", b"gone\n")
    fifo = write(tmp_path / "fifo", b"a file, then a fifo\n")
    rewritten = write(tmp_path / "rewritten.txt", b"0123456789", mtime_ns=10**18)
    job = _job(same, grown, swapped, gone, fifo, rewritten)
    with grown.open("ab") as f:
        f.write(b"and longer\n")
    write(tmp_path / "other", b"another file\n").rename(swapped)
    gone.unlink()
    fifo.unlink()
    os.mkfifo(fifo)
    with rewritten.open("r+b") as f:  # in place: its inode and size as walked
        f.write(b"abcdefghij")
    proc = RP.ReadProcess()
    try:
        answers = proc.read(job)
    finally:
        proc.close()
    assert answers is not None and len(answers) == 6
    first = answers[0]
    assert first is not None
    data, sha, st, t0 = first
    assert bytes(data) == b"as walked\n" and sha == hashlib.sha256(b"as walked\n").hexdigest()
    assert (st.st_ino, st.st_size) == (job[0][1].st_ino, 10) and t0 > 0
    assert answers[1:] == [None] * 5  # each read the long way by the thread


def test_an_answer_for_another_file_than_asked_is_no_answer(tmp_path: Path) -> None:
    f = write(tmp_path / "f.txt", b"0123456789")
    g = write(tmp_path / "g.txt", b"9876543210")
    body = bytearray(b"".join(RP._encode(os.fsencode(g), os.lstat(g))))
    with pytest.raises(ValueError, match="not an answer"):
        RP._decode(memoryview(body), _job(f))  # g's bytes, asked for f
    with pytest.raises(ValueError, match="not an answer"):
        RP._decode(memoryview(body + b"\1"), _job(g))  # an answer too many
    assert RP._decode(memoryview(body), _job(g))[0] is not None


@pytest.mark.parametrize(
    "frame",
    [
        "\\0\\0\\0\\7\\0\\0\\0\\0",  # an answer of 7 files, to a job of one
        "\\0\\0\\0\\1\\0\\0\\0\\0",  # one file's answer, of no bytes
        "\\0\\0\\0\\1\\0\\0\\0\\2\\0\\0",  # cut short: a READ without its head
    ],
)
def test_a_child_that_answers_nonsense_is_ended_and_asked_no_more(
    tmp_path: Path, frame: str
) -> None:
    f = write(tmp_path / "f.txt", b"data\n")
    proc = RP.ReadProcess()
    # another program in the child's place, answering what is not an answer
    liar = subprocess.Popen(
        ["sh", "-c", f"head -c 1 >/dev/null; printf '{frame}'; sleep 5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,
    )
    proc._proc.kill()
    proc._proc.wait()
    proc._proc, proc._to, proc._from = liar, liar.stdin, liar.stdout  # type: ignore[assignment]
    assert proc.read(_job(f)) is None
    assert proc.broken and liar.poll() is not None  # killed, not left to sleep
    assert proc.read(_job(f)) is None  # and not asked again


def test_a_child_ends_at_the_end_of_its_input(tmp_path: Path) -> None:
    proc = RP.ReadProcess()
    assert proc._to is not None
    proc._to.close()  # its send is gone (kill -9 closes the pipe the same way)
    assert proc._proc.wait(timeout=10) == 0


def test_a_job_of_big_files_only_starts_no_child(
    src: Machine, dst: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big files are read as they go, by the thread: no child is started for them."""
    a = make_agent(src)
    for i in range(3):
        write(a.folders.home / f"big{i}.bin", os.urandom((1 << 20) + i + 1))
    started = _started(monkeypatch)
    r = prepare(dst)
    data, _ = send_bytes(a, r)
    assert receive_bytes(dst, r, data).committed
    assert tree(load_agent(dst).folders.home) == tree(a.folders.home)
    assert started == []
