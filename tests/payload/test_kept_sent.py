"""How the agent left, noted by the move's final send and adopted when it leaves
(kept.SentListing, adopt_sent): the same changes told as by a walk at leaving, and
never a note of another send."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from payload_helpers import (
    load_agent,
    move,
    prepare,
    receive_bytes,
    sample_agent,
    send_bytes,
    write,
)

from lnk.agents.layout import Machine
from lnk.agents.moved import notes_dir
from lnk.errors import UsageError
from lnk.move.moved import leave, moved_away
from lnk.payload.digests import tree_digests
from lnk.payload.hashcache import HashCache
from lnk.payload.kept import (
    LEFT,
    LEFT_DIRS,
    SENT_BY,
    ChangeRecorder,
    SentListing,
    adopt_sent,
    record_left,
)
from lnk.payload.listings import dir_key, entry_key, left_files, listing_text, sidecar
from lnk.payload.walk import WalkStats, walk_agent

OLD = 1_600_000_000_000_000_000
STREAM = "ab" * 16

NAMES = [
    "plain.txt",
    "line\nbreak",
    "tab\tand\x1b[31mred",
    "é-composé",
    "e\u0301-decomposed",
    "日本語.md",
    "a b",
    "a-x",
    "a0",
]


def _tree(root: Path) -> sqlite3.Connection:
    """Odd names at two depths, a link, an empty folder, a database whose -wal and -shm
    stay beside it (its connection returned, open)."""
    h = root / "Home"
    for i, n in enumerate(NAMES):
        write(h / n, f"{i}\n".encode(), 0o644, OLD)
        write(h / "deep" / n / "f", f"deep {i}\n".encode(), 0o644, OLD)
    write(h / "before-1970", b"old\n", 0o644, -5_000_000_000)
    os.symlink("plain.txt", h / "link")
    (h / "empty-folder").mkdir()
    con = sqlite3.connect(h / "state.db")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (v)")
    con.execute("INSERT INTO t VALUES (1)")
    con.commit()
    write(root / "Agent" / "memory" / "facts.md", b"facts\n", 0o644, OLD)
    return con


def _changes(root: Path, cache: Path) -> list[str]:
    rec = ChangeRecorder(cache)
    try:
        for _ in walk_agent(root, rec, WalkStats(), None, hash_files=False, sqlite=False):
            pass
    finally:
        rec.close()
    return sorted(rec.changed)


def _noted(root: Path, cache_path: Path) -> SentListing:
    cache = HashCache(cache_path)
    try:
        sent = SentListing(cache)
        tree_digests(root, cache, listed=sent)
        sent.done(STREAM)
    finally:
        cache.close()
    return sent


def test_the_final_sends_note_tells_the_same_changes_as_a_walk_at_leaving(
    tmp_path: Path,
) -> None:
    root = tmp_path / "kept"
    db = _tree(root)
    assert (root / "Home" / "state.db-wal").exists()
    walked = tmp_path / "walked.sqlite"
    record_left(root, walked)
    noted = root / ".lnk-hashes.sqlite"
    assert _noted(root, noted).noted > 0
    assert adopt_sent(noted, STREAM)
    con = sqlite3.connect(noted)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert LEFT_DIRS in tables and LEFT not in tables and SENT_BY not in tables
    assert _changes(root, noted) == _changes(root, walked) == []
    # a person works there after the agent left
    h = root / "Home"
    write(h / "line\nbreak", b"changed here\n", 0o644, OLD)
    write(h / "deep" / "é-composé" / "added", b"added here\n")
    write(h / "new-folder" / "f", b"new\n")
    os.utime(h / "before-1970", ns=(OLD, OLD))
    os.unlink(h / "a b")
    with open(h / "tab\tand\x1b[31mred", "ab") as f:
        f.write(b"more\n")
    want = [
        "Home/before-1970",
        "Home/deep/é-composé/added",
        "Home/line\nbreak",
        "Home/new-folder/f",
        "Home/tab\tand\x1b[31mred",
    ]
    assert _changes(root, noted) == _changes(root, walked) == want
    db.close()


def test_a_note_of_another_stream_is_not_adopted_and_leaving_walks(
    src: Machine, dst: Machine
) -> None:
    a = sample_agent(src)
    write(a.folders.home / "a.txt", b"a\n", 0o644, OLD)
    cache = HashCache(a.runtime / "hashes.sqlite")
    try:
        sent = SentListing(cache)
        tree_digests(a.folders.root, cache, listed=sent)
        sent.done(STREAM)  # a final whose move was undone: the agent went on
    finally:
        cache.close()
    write(a.folders.home / "a.txt", b"the agent went on\n", 0o644, OLD)
    move(a, dst)
    note = leave(src, a, "b", final="cd" * 16)  # the destination committed another stream
    kept = Path(note["kept"]) / ".lnk-hashes.sqlite"
    con = sqlite3.connect(kept)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert LEFT in tables  # walked at leaving, as the agent is now
    assert not tables & {LEFT_DIRS, SENT_BY, "sent_dirs"}  # the other note is gone
    assert _changes(Path(note["kept"]), kept) == []


def test_a_note_with_a_lost_row_names_no_stream(tmp_path: Path) -> None:
    root = tmp_path / "kept"
    write(root / "Home" / "f", b"f\n", 0o644, OLD)
    cache = HashCache(tmp_path / "c.sqlite")
    try:
        sent = SentListing(cache)
        tree_digests(root, cache, listed=sent)
        assert cache.db is not None
        cache.drop()  # another writer held the lock: what was written is gone
        sent.done(STREAM)
    finally:
        cache.close()
    assert not adopt_sent(tmp_path / "c.sqlite", STREAM)
    empty = HashCache(tmp_path / "e.sqlite")
    try:
        nothing = SentListing(empty)
        nothing.done(STREAM)  # no walk noted a folder (no digests were asked for)
    finally:
        empty.close()
    assert not adopt_sent(tmp_path / "e.sqlite", STREAM)


def test_a_move_back_after_a_noted_final_keeps_a_persons_change_made_after_it(
    src: Machine, dst: Machine
) -> None:
    """The final is noted; leaving adopts it; a change a person made in the kept
    folder after the final (the agent paused, not yet gone) is theirs on a move back."""
    a = sample_agent(src)
    write(a.folders.home / "notes.txt", b"as the agent left it\n", 0o644, OLD)
    write(a.folders.home / "other.txt", b"other\n", 0o644, OLD)
    move(a, dst)
    leave(src, a, "b")  # first move: no note, walked
    b = load_agent(dst)
    r = prepare(src, b.id)  # the move back, to the kept folder
    inv = r.inventory()
    assert inv.dirs  # the kept folder's digests: the final's keeper walks and notes
    bulk, brep = send_bytes(b, r, phase="bulk")
    assert not receive_bytes(src, r, bulk).committed
    final, frep = send_bytes(
        b, r, phase="final", since=brep.watermarks, base_stream=brep.stream_id, inventory=inv
    )
    # paused at b: a person edits a file there before the agent's copy is let go
    write(b.folders.home / "notes.txt", b"a person's edit at b\n", 0o644, OLD)
    rep = receive_bytes(src, r, final)
    assert rep.committed and rep.stream_id == frep.stream_id
    note = moved_away(dst, None, b.id, "here", final=rep.stream_id).kept
    kept = Path(note) / ".lnk-hashes.sqlite"
    con = sqlite3.connect(kept)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert LEFT_DIRS in tables and LEFT not in tables  # adopted, not walked
    assert _changes(Path(note), kept) == ["Home/notes.txt"]


def test_a_stream_id_that_is_not_one_is_refused(src: Machine) -> None:
    a = sample_agent(src)
    with pytest.raises(UsageError, match="not a stream ID"):
        moved_away(src, None, a.id, "b", final="../../etc")
    assert load_agent(src).id == a.id  # nothing was done


_names = st.text(
    st.characters(blacklist_characters="\0/", blacklist_categories=("Cs",)), min_size=1
).filter(lambda n: n not in (".", ".."))
_stats = st.tuples(
    st.sampled_from([stat.S_IFREG | 0o644, stat.S_IFLNK | 0o777, stat.S_IFIFO | 0o600]),
    st.integers(0, 2**63),
    st.integers(-(2**62), 2**62),
    st.integers(-(2**62), 2**62),
    st.integers(0, 2**64),
    st.integers(1, 2**16),
)


def _stat(mode: int, size: int, mtime: int, ctime: int, ino: int, nlink: int) -> os.stat_result:
    """The parts of an lstat a listing holds, as ``entry_key`` reads them."""
    fake = SimpleNamespace(
        st_mode=mode, st_size=size, st_mtime_ns=mtime, st_ctime_ns=ctime, st_ino=ino, st_nlink=nlink
    )
    return cast(os.stat_result, fake)


@given(st.dictionaries(_names, st.one_of(_stats, st.text("0123456789abcdef"))))
def test_a_listing_is_read_back_as_it_was_made(
    entries: dict[str, tuple[int, int, int, int, int, int] | str],
) -> None:
    keys = []
    want = {}
    names = set(entries)
    for name in sorted(entries):
        v = entries[name]
        if isinstance(v, str):
            keys.append(dir_key(name, 0o755, v))  # a subfolder's part
            continue
        mode, size, mtime, ctime, ino, nlink = v
        keys.append(entry_key(name, _stat(mode, size, mtime, ctime, ino, nlink)))
        if stat.S_ISREG(mode) and not sidecar(name, names):
            want[name] = (size, mtime, ctime, ino)
    text = listing_text(keys)
    assert left_files(text) == want
    if text:
        assert left_files(text[:-1]) == {}  # cut short: counts as no note at all


def test_a_garbled_listing_counts_as_none() -> None:
    good = listing_text([entry_key("f", _stat(stat.S_IFREG | 0o644, 1, 2, 3, 4, 1))])
    assert left_files(good) == {"f": (1, 2, 3, 4)}
    for bad in (b"f\x001\n", good.replace(b"\x00", b"\x01"), b"x" + good[1:].replace(b"1", b"z")):
        assert left_files(bad) == {}


def test_a_name_that_is_not_utf8_stops_no_leaving(src: Machine) -> None:
    """A person gave a file a name that is not UTF-8 after the final: the agent still
    leaves (its note, its settings gone), without the stats noted by a walk."""
    a = sample_agent(src)
    with open(os.fsencode(str(a.folders.home)) + b"/caf\xe9", "wb") as f:
        f.write(b"named in latin-1\n")
    note = leave(src, a, "b")
    assert Path(note["kept"]).is_dir() and not a.settings_path.exists()
    assert (notes_dir(src) / f"{a.id}.json").exists()
