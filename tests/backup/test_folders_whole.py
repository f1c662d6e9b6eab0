"""A folder unchanged since the last backup to a repository is written from that
backup's lines: none of its files is opened or looked up one by one; anything that
changed, a prune that took its blobs, or a damaged cache row sends the backup back to
the files, and every restore still equals the agent."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from bk_helpers import (
    age,
    agent_files,
    collections_of,
    give_keys,
    sample_agent,
    source_tree,
    write,
)

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.backup import agent_files as AF
from lnk.backup import file_reads as F
from lnk.backup.agent import backup_agent
from lnk.backup.agent_restore import restore_agent
from lnk.backup.filecache import ChunkCache
from lnk.payload import pinned as P


def _tree(a: Agent) -> None:
    source_tree(a, 4, 6)
    age(a)


def _backed_up(src: Machine, url: str) -> Agent:
    """The sample agent with a source tree, backed up twice (its folder rows written)."""
    a = sample_agent(src)
    _tree(a)
    backup_agent(src, a, url)
    backup_agent(src, a, url)
    return a


class Spy:
    """Counts the files a backup opens and the files it looks up one by one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened: list[str] = []
        self.looked_up: list[str] = []
        real_open, real_file = F.open_file, ChunkCache.file

        def opening(path: str | Path) -> int:
            self.opened.append(str(path))
            return real_open(path)

        def looking(cache: ChunkCache, rel: str, st: os.stat_result) -> object:
            self.looked_up.append(rel)
            return real_file(cache, rel, st)

        monkeypatch.setattr(F, "open_file", opening)
        monkeypatch.setattr(P, "open_file", opening)  # an agent's files
        monkeypatch.setattr(ChunkCache, "file", looking)

    def clear(self) -> None:
        self.opened.clear()
        self.looked_up.clear()


def _restored_equals(src: Machine, dst: Machine, url: str) -> None:
    give_keys(src, dst)
    restore_agent(dst, "work", url, force=True)
    a, b = registry.find(src, "work"), registry.find(dst, "work")
    mine, theirs = agent_files(a.folders.root), agent_files(b.folders.root)
    for rel in [r for r in mine if (a.folders.root / r).is_symlink()]:
        assert os.readlink(b.folders.root / rel) == os.readlink(a.folders.root / rel)
        del mine[rel], theirs[rel]  # a link's own mtime is not kept
    assert theirs == mine
    assert collections_of(b) == collections_of(a)


def test_unchanged_folders_come_whole_and_a_change_reaches_only_its_folder(
    src: Machine, dst: Machine, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src)
    _tree(a)
    backup_agent(src, a, url)  # reads everything; each folder's lines kept by its digest
    spy = Spy(monkeypatch)
    rep = backup_agent(src, a, url)
    assert rep.new_blobs == 0 and rep.files > 24
    # the src tree is digested (no hard link, no database): none of it looked up
    assert [p for p in spy.looked_up if p.startswith("Home/src/")] == []
    assert [p for p in spy.opened if "/Home/src/" in p] == []
    _restored_equals(src, dst, url)

    # one file changes: only its folder's files are looked up, only it is read
    spy.clear()
    write(a.folders.home / "src" / "pkg3" / "mod" / "m2.py", b"x = 'changed'\n")
    rep = backup_agent(src, a, url)
    under = sorted(p for p in spy.looked_up if p.startswith("Home/src/"))
    assert under == sorted({f"Home/src/pkg3/mod/m{i}.py" for i in range(6)} | {"Home/src/README"})
    assert [Path(p).name for p in spy.opened if "/Home/src/" in p] == ["m2.py"]
    _restored_equals(src, dst, url)

    # a folder removed, one added, a mode changed: each restore equals the agent
    import shutil

    shutil.rmtree(a.folders.home / "src" / "pkg0")
    write(a.folders.home / "src" / "pkg9" / "new.py", b"new\n")
    os.chmod(a.folders.home / "src" / "pkg1" / "mod" / "m3.py", 0o640)
    backup_agent(src, a, url)
    _restored_equals(src, Machine(dst.home.parent / "third"), url)  # nothing left over


def test_a_folder_too_big_to_hold_is_walked_into_and_its_subfolders_come_whole(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder's lines are held until written: one with more files than
    agent_files.WHOLE_FILES is walked into (memory stays bounded), and its smaller
    subfolders still come whole."""
    monkeypatch.setattr(AF, "WHOLE_FILES", 6)  # Home/src holds 25, each pkgN/mod 6
    a = _backed_up(src, local_url)
    spy = Spy(monkeypatch)
    rep = backup_agent(src, a, local_url)
    assert rep.new_blobs == 0
    # only what lies directly in the folders too big to hold is looked up
    assert sorted(p for p in spy.looked_up if p.startswith("Home/src/")) == ["Home/src/README"]
    assert [p for p in spy.opened if "/Home/src/" in p] == []
    _restored_equals(src, dst, local_url)


def test_a_prune_that_took_a_folders_blobs_makes_it_read_again(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _backed_up(src, local_url)
    root = Path(local_url.removeprefix("file://"))
    for p in [
        *(root / "data").rglob("*"),
        *(root / "index").rglob("*"),
        *(root / "snapshots").iterdir(),
    ]:
        if p.is_file():
            p.unlink()  # every blob gone: the rows name blobs nobody holds
    spy = Spy(monkeypatch)
    rep = backup_agent(src, a, local_url)
    assert len([p for p in spy.opened if "/Home/src/" in p]) == 25  # every file read again
    assert rep.new_blobs >= 25
    _restored_equals(src, dst, local_url)


def test_damaged_or_mismatched_rows_fall_back_to_the_files(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _backed_up(src, local_url)
    db = sqlite3.connect(a.runtime / "backup-chunks.sqlite")
    try:
        # one row's body is garbage, another names a subfolder digest that is not its own
        db.execute(
            "UPDATE d SET body = x'00112233' WHERE path = CAST(? AS BLOB)", ("Home/src/pkg1/mod",)
        )
        db.execute(
            "UPDATE d SET digest = ? WHERE path = CAST(? AS BLOB)",
            ("0" * 64, "Home/src/pkg2/mod"),
        )
        db.commit()
    finally:
        db.close()
    spy = Spy(monkeypatch)
    backup_agent(src, a, local_url)
    looked = {p.rsplit("/", 1)[0] for p in spy.looked_up if p.startswith("Home/src/")}
    assert {"Home/src/pkg1/mod", "Home/src/pkg2/mod"} <= looked  # those went file by file
    assert "Home/src/pkg3/mod" not in looked  # the others still whole
    _restored_equals(src, dst, local_url)


def test_a_file_swapped_for_a_link_after_the_walk_is_not_read_through_it(
    src: Machine, dst: Machine, local_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not the agent's\n")
    victim = a.folders.home / "notes.txt"
    write(victim, b"my notes\n")
    real_open = F.open_file

    def swap_then_open(path: str | Path) -> int:
        if str(path) == str(victim):
            victim.unlink()
            os.symlink(secret, victim)
        return real_open(path)

    monkeypatch.setattr(F, "open_file", swap_then_open)
    monkeypatch.setattr(P, "open_file", swap_then_open)  # an agent's files
    rep = backup_agent(src, a, local_url)
    monkeypatch.undo()
    give_keys(src, dst)
    restore_agent(dst, "work", local_url, force=True)
    back = registry.find(dst, "work").folders.home
    assert not (back / "notes.txt").exists()  # left out, never the link's target
    assert rep.files >= 1
    stored = b"".join(p.read_bytes() for p in back.rglob("*") if p.is_file() and not p.is_symlink())
    assert b"not the agent's" not in stored


def test_a_fifo_swapped_in_after_the_walk_neither_blocks_nor_is_stored(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sample_agent(src)
    victim = a.folders.home / "notes.txt"
    write(victim, b"my notes\n")
    real_open = F.open_file

    def swap_then_open(path: str | Path) -> int:
        if str(path) == str(victim) and not victim.is_fifo():
            victim.unlink()
            os.mkfifo(victim)  # nobody writes it: a blocking open would hang here
        return real_open(path)

    monkeypatch.setattr(F, "open_file", swap_then_open)
    monkeypatch.setattr(P, "open_file", swap_then_open)  # an agent's files
    backup_agent(src, a, local_url)
    monkeypatch.undo()
    give_keys(src, dst)
    restore_agent(dst, "work", local_url, force=True)
    back = registry.find(dst, "work").folders.home
    assert not (back / "notes.txt").exists()
    assert (back / "run.sh").read_bytes() == b"#!/bin/sh\necho hi\n"  # the rest is there


def test_a_row_that_speaks_for_another_folder_is_not_believed(
    src: Machine, dst: Machine, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows are read back from disk: a row whose lines name a path outside its
    folder (elsewhere, or a sibling that shares its name's start) is not used."""
    a = _backed_up(src, local_url)
    db = sqlite3.connect(a.runtime / "backup-chunks.sqlite")
    try:

        def rewrite(rel: str, edit: Callable[[bytes], bytes]) -> None:
            (body,) = db.execute(
                "SELECT body FROM d WHERE path = CAST(? AS BLOB)", (rel,)
            ).fetchone()
            plain = edit(zstandard.ZstdDecompressor().decompress(body))
            db.execute(
                "UPDATE d SET body = ? WHERE path = CAST(? AS BLOB)",
                (zstandard.ZstdCompressor().compress(plain), rel),
            )

        # well-formed rows, each with a line of another folder
        rewrite(
            "Home/src/pkg3/mod",
            lambda b: (
                b
                + b'E{"p":"Home/evil.txt","t":"f","m":420,"s":0,"h":"'
                + b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
                + b'","d":false,"mt":0}\n'
            ),
        )
        rewrite(
            "Home/src/pkg2/mod",
            lambda b: b.replace(b'"Home/src/pkg2/mod/m1.py"', b'"Home/src/pkg2/mod0/m1.py"'),
        )
        db.commit()
    finally:
        db.close()
    spy = Spy(monkeypatch)
    rep = backup_agent(src, a, local_url)
    looked = {p.rsplit("/", 1)[0] for p in spy.looked_up if p.startswith("Home/src/")}
    assert {"Home/src/pkg3/mod", "Home/src/pkg2/mod"} <= looked  # went file by file
    assert "Home/src/pkg0/mod" not in looked
    give_keys(src, dst)
    restore_agent(dst, "work", local_url, force=True, snapshot=rep.snapshot)
    back = registry.find(dst, "work").folders.home
    assert not (back / "evil.txt").exists() and not (back / "src" / "pkg2" / "mod0").exists()
    _restored_equals(src, dst, local_url)
