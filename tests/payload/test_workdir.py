"""A run's private folder in the agent's runtime folder, and what dead runs left there
(lnk/payload/workdir.py)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from payload_helpers import make_agent, prepare, send_bytes

from lnk.agents.layout import Machine
from lnk.payload.workdir import HELD, STALE_S, WorkDir, sweep


def left(runtime: Path, name: str, held: bool = True, age: float = STALE_S + 60) -> Path:
    d = runtime / name
    d.mkdir(parents=True)
    (d / "snap-1.sqlite").write_bytes(b"x" * 100)
    if held:
        (d / HELD).touch()
    t = time.time() - age
    os.utime(d, (t, t))
    return d


def test_what_a_dead_run_left_goes_and_nothing_else(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    dead = left(runtime, "lnk-send-dead")
    unlocked = left(runtime, "lnk-send-nolock", held=False)  # killed before its lock
    fresh = left(runtime, "lnk-send-fresh", age=5)  # a run that just made its folder
    other = left(runtime, "lnk-backup-dead")  # another kind: its own runs sweep it
    live = left(runtime, "lnk-send-live")
    fd = os.open(live / HELD, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a run still holds it, however old its folder
        assert sorted(sweep(runtime, "lnk-send-")) == ["lnk-send-dead", "lnk-send-nolock"]
    finally:
        os.close(fd)
    assert not dead.exists() and not unlocked.exists()
    assert fresh.exists() and other.exists() and live.exists()


def test_a_run_holds_its_folder_and_removes_it(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    w = WorkDir(runtime, "lnk-send-")
    t = time.time() - STALE_S - 60
    os.utime(w.path, (t, t))
    assert sweep(runtime, "lnk-send-") == [] and w.path.is_dir()  # held: kept
    w.close()
    assert not w.path.exists() and list(runtime.iterdir()) == []


def test_a_send_leaves_nothing_in_the_runtime_folder(src: Machine, dst: Machine) -> None:
    a = make_agent(src)
    old = left(a.runtime, "lnk-send-from-a-killed-send")
    before = {p.name for p in a.runtime.iterdir()} - {old.name}
    send_bytes(a, prepare(dst))
    after = {p.name for p in a.runtime.iterdir()}
    assert not any(n.startswith("lnk-send-") for n in after), after
    assert before <= after
