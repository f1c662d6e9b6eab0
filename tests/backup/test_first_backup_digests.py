"""A first backup reads every file anyway: it remembers each folder's digest by its
fingerprint as it goes (the rows a stat pass would make from the files' rows), so the
backup after it finds every unchanged folder's digest with a stat of each entry and
computes none; a folder changed within the clock's step of the walk is not
remembered."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
import types
from pathlib import Path
from typing import Any

import pytest
from bk_helpers import age, sample_agent, source_tree, write

from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.backup import agent_files as AF
from lnk.backup.agent import backup_agent
from lnk.payload import digests as D
from lnk.payload.hashcache import RACY_NS, HashCache

NEVER_RACY = -(10**18)  # "changed too recently" never holds: every folder may be remembered


def _tree(a: Agent) -> None:
    source_tree(a, 3, 4)
    write(a.folders.home / "src" / "empty", b"")
    os.mkfifo(a.folders.home / "src" / "pkg2" / "pipe")  # in no digest, in no backup
    age(a)


def _rows(path: Path) -> dict[str, tuple[bytes, str, int]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        found = db.execute("SELECT dir, fp, digest, files FROM dg").fetchall()
    return {d: (fp, digest, n) for d, fp, digest, n in found}


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders whose digest is computed from their files' rows from now on."""
    computed: list[str] = []
    real = D._compute

    def compute(fr: Any, *args: Any) -> Any:
        computed.append(fr.rel)  # (a folder with no digest is computed every time)
        return real(fr, *args)

    monkeypatch.setattr(D, "_compute", compute)
    return computed


@pytest.mark.parametrize("ahead", [False, True], ids=["here", "read-ahead"])
def test_a_first_backup_remembers_each_folders_digest_as_a_stat_pass_would(
    src: Machine,
    url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    ahead: bool,
) -> None:
    """(read-ahead: the files read by the second process, lnk/backup/small_reads.py)"""
    asked = request.getfixturevalue("read_ahead_at_once") if ahead else []
    monkeypatch.setattr(AF, "RACY_NS", NEVER_RACY)
    monkeypatch.setattr(D, "RACY_NS", NEVER_RACY)
    a = sample_agent(src)
    _tree(a)
    backup_agent(src, a, url)
    assert (sum(asked) >= 8) == ahead
    rows = _rows(a.runtime / "hashes.sqlite")
    src_dirs = {"Home/src", *(f"Home/src/pkg{d}" for d in range(3))}
    assert src_dirs | {f"Home/src/pkg{d}/mod" for d in range(3)} <= rows.keys()
    assert rows["Home/src"][2] == 14  # regular files at any depth: no link, no fifo

    # the very rows a stat pass makes from the files' rows alone
    copy = tmp_path / "hashes.sqlite"
    shutil.copy(a.runtime / "hashes.sqlite", copy)
    with contextlib.closing(sqlite3.connect(copy)) as db:
        db.execute("DELETE FROM dg")
        db.commit()
    cache = HashCache(copy)
    digests, counts = D.tree_digests(a.folders.root, cache)
    cache.close()
    assert _rows(copy) == rows
    # a hard link's folders have no digest to remember, whoever looks
    no_digest = counts.keys() - digests.keys()
    assert no_digest == {"Home/docs", "Home"}

    # so the next backup computes no folder's digest, and stores nothing new
    computed = _counting(monkeypatch)
    rep = backup_agent(src, a, url)
    assert rep.new_blobs == 0
    assert sorted(computed) == sorted(no_digest)

    # a file changed: its folder's fingerprint differs, then its parents' (each holds
    # its subfolder's digest): their digests are computed again, and only theirs
    computed.clear()
    changed = a.folders.home / "src" / "pkg0" / "mod" / "m3.py"
    write(changed, b"x = 'changed'\n")
    long_ago = time.time_ns() - 3600 * 10**9
    os.utime(changed, ns=(long_ago, long_ago))
    rep = backup_agent(src, a, url)
    assert rep.new_blobs >= 1
    again = {"Home/src/pkg0/mod", "Home/src/pkg0", "Home/src"}
    assert sorted(computed) == sorted(no_digest | again)


def test_a_folder_changed_within_the_clocks_step_of_the_walk_is_not_remembered(
    src: Machine, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src)
    _tree(a)
    time.sleep(0.05)
    mid = time.time_ns()  # the walk's start less RACY_NS, as the backup will see it
    time.sleep(0.05)
    os.chmod(a.folders.home / "src" / "pkg1" / "mod" / "m2.py", 0o600)  # its ctime: now
    monkeypatch.setattr(AF, "time", types.SimpleNamespace(time_ns=lambda: mid + RACY_NS))
    backup_agent(src, a, url)
    rows = _rows(a.runtime / "hashes.sqlite")
    assert "Home/src/pkg1/mod" not in rows
    # its siblings and its parent are remembered (the parent holds only its digest)
    assert {"Home/src/pkg0/mod", "Home/src/pkg2/mod", "Home/src/pkg1", "Home/src"} <= rows.keys()

    monkeypatch.setattr(D, "RACY_NS", NEVER_RACY)
    computed = _counting(monkeypatch)
    assert backup_agent(src, a, url).new_blobs == 0
    assert sorted(computed) == sorted({"Home/docs", "Home", "Home/src/pkg1/mod"})
