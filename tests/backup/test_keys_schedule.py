"""The owner is told about the key pair a backup makes; schedules name the running
lnk and catch up; ``backup status --max-age`` for monitoring; an unchanged second
backup reads nothing and uploads one snapshot."""

from __future__ import annotations

import json
import os
import stat
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from bk_helpers import Recording, age, sample_agent, write
from lnkrun import lnk, ok

from lnk.agents.layout import Machine
from lnk.agents.registry import LAST_BACKUP
from lnk.backup import agent_files as AF
from lnk.backup import file_reads as F
from lnk.backup.agent import backup_agent
from lnk.backup.schedule import lnk_command
from lnk.backup.timers import plist_text
from lnk.transport.buckets import open_bucket


def test_the_run_that_makes_the_key_says_so_once_and_status_warns_until_export(
    src: Machine, local_url: str, tmp_path: Path
) -> None:
    sample_agent(src)
    first = ok("agent", "backup", "--to", local_url)
    assert "lnk backup key export" in first.err and "backup key pair" in first.err
    again = ok("agent", "backup", "--to", local_url)
    assert "key pair" not in again.err
    st = ok("agent", "status", "--json").json()
    assert "never exported" in st["warning"]
    assert "warning: the backup key was never exported" in ok("agent", "status").out
    ok("backup", "key", "export", "--public")  # the public half restores nothing
    assert "warning" in ok("agent", "status", "--json").json()
    key = ok("backup", "key", "export").out
    assert key.startswith("lnk-backup-key 1") and "private " in key
    assert "warning" not in ok("agent", "status", "--json").json()


def test_a_schedule_names_the_lnk_that_wrote_it(
    src: Machine, local_url: str, tmp_path: Path
) -> None:
    """A venv's lnk called by its path schedules itself, not the first lnk on PATH."""
    sample_agent(src)
    venv = tmp_path / "venv" / "bin"
    decoy = tmp_path / "decoy"
    for d, body in (
        (venv, f"#!{sys.executable}\nfrom lnk.cli.main import main\nmain()\n"),
        (decoy, "#!/bin/sh\necho decoy\n"),
    ):
        write(d / "lnk", body.encode(), 0o755)
    env = {"PATH": f"{decoy}:{os.environ['PATH']}"}
    import subprocess

    p = subprocess.run(
        [str(venv / "lnk"), "agent", "backup", "schedule", "--to", local_url, "--json"],
        capture_output=True,
        env=os.environ | env,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["command"][0] == str((venv / "lnk").resolve())
    assert r["crontab"].split()[5] == str((venv / "lnk").resolve())
    service = Path(next(f for f in r["files"] if f.endswith(".service"))).read_text()
    assert f"ExecStart={(venv / 'lnk').resolve()} agent backup" in service
    assert str(decoy) not in service
    timer = Path(next(f for f in r["files"] if f.endswith(".timer"))).read_text()
    assert "Persistent=true" in timer and "OnCalendar=" in timer


def test_run_as_a_module_the_schedule_names_this_python() -> None:
    assert lnk_command("/x/lnk/__main__.py") == [str(Path(sys.executable).resolve()), "-m", "lnk"]
    assert lnk_command("-c") == [str(Path(sys.executable).resolve()), "-m", "lnk"]


def test_launchd_catches_up_with_calendar_intervals(src: Machine) -> None:
    a = sample_agent(src)
    text = plist_text(a, ["/opt/lnk", "agent"], 6 * 3600)
    assert "StartCalendarInterval" in text and "StartInterval<" not in text
    assert text.count("<key>Hour</key>") == 4


def test_backup_status_max_age_fails_when_too_old_or_never(src: Machine, local_url: str) -> None:
    a = sample_agent(src)
    never = lnk("agent", "backup", "status", "--max-age", "2d")
    assert never.code == 13 and "no successful backup" in never.err
    assert never.err.startswith("lnk: error:") and "Traceback" not in never.err
    ok("agent", "backup", "--to", local_url)
    st = ok("agent", "backup", "status", "--max-age", "2d", "--json").json()
    assert st["stale"] is False and st["last_ok"] is not None
    # a failed run keeps the last success; an old success fails the check
    assert lnk("agent", "backup", "--to", "file:///nonexistent/nowhere").code != 0
    last = json.loads((a.runtime / LAST_BACKUP).read_text())
    assert last["ok"] is False and last["last_ok"] == st["last_ok"]
    old = (datetime.now(UTC) - timedelta(days=3)).isoformat()
    (a.runtime / LAST_BACKUP).write_text(json.dumps(last | {"last_ok": old}))
    stale = lnk("agent", "backup", "status", "--max-age", "2d", "--json")
    assert stale.code == 13 and json.loads(stale.out)["stale"] is True
    assert ok("agent", "backup", "status", "--max-age", "4d").code == 0
    assert lnk("agent", "backup", "status", "--max-age", "soon").code == 5


def test_an_unchanged_second_backup_reads_nothing_and_uploads_one_snapshot(
    src: Machine, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src, big=2 << 20)
    for i in range(50):
        write(a.folders.home / "src" / f"f{i}.py", f"print({i})\n".encode() * (i + 1))
    age(a)
    backup_agent(src, a, url)
    reads: list[int] = []
    real = F.read

    def counting(fd: int, n: int) -> bytes:
        data = real(fd, n)
        reads.append(len(data))
        return data

    exports: list[object] = []
    monkeypatch.setattr(F, "read", counting)
    rec = Recording(open_bucket(url))
    import lnk.agents.stores as stores

    real_open = stores.open_agent_store

    def spy_store(*args: object, **kw: object) -> object:
        s = real_open(*args, **kw)  # type: ignore[arg-type]
        real_export = s.export

        def export(cid: object) -> object:
            exports.append(cid)
            return real_export(cid)  # type: ignore[arg-type]

        s.export = export  # type: ignore[method-assign]
        return s

    monkeypatch.setattr(AF, "open_agent_store", spy_store)
    rep = backup_agent(src, a, url, bucket=rec)
    assert sum(reads) == 0 and exports == []
    assert rep.new_blobs == 0
    assert [k for k in rec.puts if not k.startswith("locks/")] == [f"snapshots/{rep.snapshot}"]
    assert not any(k.startswith("data/") or k.startswith("index/") for k in rec.puts)
    # a changed file is read again (the count can fail)
    write(a.folders.home / "src" / "f1.py", b"changed\n")
    backup_agent(src, a, url)
    assert sum(reads) == len(b"changed\n")
    assert stat.S_ISREG(os.stat(a.folders.home / "src" / "f1.py").st_mode)
