"""The backup's chunk cache: unchanged files and collections are not read again, yet a
changed file, a changed collection or chunks a prune removed are always stored afresh."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bk_helpers import EVENTS, age, agent_files, collections_of, give_keys, sample_agent, write

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.stores import open_agent_store
from lnk.backup import file_reads as F
from lnk.backup.agent import backup_agent
from lnk.backup.agent_restore import restore_agent
from lnk.backup.filecache import ChunkCache
from lnk.payload import pinned as P
from lnk.payload.cachedb import COMMIT_EVERY


def _bucket(tmp_path: Path) -> str:
    root = tmp_path / "bucket"
    root.mkdir()
    return f"file://{root}"


def _restore_and_compare(src: Machine, dst: Machine, url: str) -> None:
    give_keys(src, dst)
    restore_agent(dst, "work", url, force=True)
    a, b = registry.find(src, "work"), registry.find(dst, "work")
    assert agent_files(b.folders.root) == agent_files(a.folders.root)
    assert collections_of(b) == collections_of(a)


def test_unchanged_files_are_not_read_and_changes_are(
    src: Machine, dst: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _bucket(tmp_path)
    a = sample_agent(src, big=3 << 20)
    age(a)
    backup_agent(src, a, url)
    big = a.folders.home / "big.bin"
    # same size, new bytes, mtime put back: ctime still tells the change apart
    st = os.stat(big)
    write(big, os.urandom(st.st_size), mtime_ns=st.st_mtime_ns)
    s = open_agent_store(a.folders.chats, a.settings.store)
    try:
        assert s.append(EVENTS, 6, {"role": "user", "text": "one more"})
    finally:
        s.close()
    read: list[str] = []
    orig = F.open_file

    def spy(path: str | Path) -> int:
        read.append(str(path))
        return orig(path)

    monkeypatch.setattr(F, "open_file", spy)
    monkeypatch.setattr(P, "open_file", spy)  # an agent's files
    rep = backup_agent(src, registry.find(src, "work"), url)
    assert [Path(p).name for p in read] == ["big.bin"]  # the one changed file
    assert rep.new_blobs >= 3  # big.bin's 3 chunks, the changed log, lists
    _restore_and_compare(src, dst, url)


def test_a_prune_that_removed_cached_chunks_is_survived(
    src: Machine, dst: Machine, tmp_path: Path
) -> None:
    url = _bucket(tmp_path)
    a = sample_agent(src, big=2 << 20)
    backup_agent(src, a, url)
    root = Path(url.removeprefix("file://"))
    for p in list((root / "data").rglob("*")) + list((root / "index").rglob("*")):
        if p.is_file():
            p.unlink()  # every pack gone: the cache names chunks nobody holds
    for p in (root / "snapshots").iterdir():
        p.unlink()
    rep = backup_agent(src, registry.find(src, "work"), url)
    assert rep.new_blobs >= 2
    _restore_and_compare(src, dst, url)


def test_cache_keys_on_the_stat_and_the_repository(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 10)
    st = os.stat(f)
    c = ChunkCache(tmp_path / "c.sqlite", "repo1")
    c.store_file("Home/f", st, "sha", ["aa"])
    c.store_collection("files\0events\0x", "1:5", 10, 3, ["bb"])
    assert c.file("Home/f", st) == ("sha", ["aa"])
    assert c.collection("files\0events\0x", "1:5") == (10, 3, ["bb"])
    assert c.collection("files\0events\0x", "1:6") is None
    c.close()
    other = ChunkCache(tmp_path / "c.sqlite", "repo2")
    assert other.file("Home/f", st) is None
    other.close()
    f.write_bytes(b"y" * 10)
    again = ChunkCache(tmp_path / "c.sqlite", "repo1")
    assert again.file("Home/f", os.stat(f)) is None
    again.close()


def test_file_rows_written_in_batches_are_found_before_and_after(tmp_path: Path) -> None:
    """Rows wait to be written a batch at a time: found meanwhile, written by the batch
    or by close, and a cache that held no row for the repository when first asked
    still finds the rows stored since."""
    f = tmp_path / "f"
    f.write_bytes(b"x" * 10)
    st = os.stat(f)
    c = ChunkCache(tmp_path / "c.sqlite", "repo1")
    assert c.file("Home/a", st) is None  # nothing held: not asked again per file
    c.store_file("Home/a", st, "sha-a", ["aa", "ab"])
    c.store_file("Home/empty", st, "sha-e", [])
    assert c.file("Home/a", st) == ("sha-a", ["aa", "ab"])  # before any batch
    for i in range(COMMIT_EVERY):  # one batch written
        c.store_file(f"Home/many/{i}", st, f"sha-{i}", ["cc"])
    c.store_file("Home/last", st, "sha-l", ["dd"])
    c.close()  # and the rest
    again = ChunkCache(tmp_path / "c.sqlite", "repo1")
    assert again.file("Home/a", st) == ("sha-a", ["aa", "ab"])
    assert again.file(f"Home/many/{COMMIT_EVERY - 1}", st) == (f"sha-{COMMIT_EVERY - 1}", ["cc"])
    assert again.file("Home/last", st) == ("sha-l", ["dd"])
    assert again.file("Home/empty", st) is None  # no chunks, not empty: no word
    again.close()
