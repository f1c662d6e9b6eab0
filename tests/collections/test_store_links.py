"""An agent's store lies in a folder the agent writes (``chats/``), and lnk reads it
outside the agent's sandbox (a move, a backup, the bridge): a link planted there is
never followed, so nothing it names (a file of the machine's, another agent's store)
is read as the agent's."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from lnk.collections import open_store
from lnk.collections.fileio import encode_name, event_file
from lnk.collections.ids import CollectionId
from lnk.errors import InvalidInput

EVENTS = CollectionId("events", "link:main")
NOTES = CollectionId("notes", "link:main")
SECRET = {"auths": {"registry.example": {"auth": "c2VjcmV0"}}}  # a docker config, say


def secret_file(tmp_path: Path, name: str = "config.json") -> Path:
    p = tmp_path / "machine" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(SECRET))
    return p


def test_an_event_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    root = tmp_path / "chats"
    s = open_store("files", root)
    assert s.append(EVENTS, 1, {"text": "one"})
    d = root / "events" / encode_name(EVENTS.name)
    os.symlink(secret_file(tmp_path), d / event_file(2))
    assert [e.data for e in s.iter_events(EVENTS)] == [{"text": "one"}]
    exported = json.dumps(list(s.export(EVENTS, 0)))
    assert "one" in exported and "c2VjcmV0" not in exported


def test_a_collection_folder_that_is_a_link_is_neither_listed_nor_read(tmp_path: Path) -> None:
    root = tmp_path / "chats"
    s = open_store("files", root)
    assert s.append(EVENTS, 1, {"text": "mine"})
    # a folder of the machine's made to look like a collection
    other = tmp_path / "machine" / "look-alike"
    other.mkdir(parents=True)
    (other / ".name").write_text("stolen")
    (other / event_file(1)).write_text(json.dumps(SECRET))
    os.symlink(other, root / "events" / encode_name("stolen"))
    assert s.collections() == [EVENTS]
    assert list(s.iter_events(CollectionId("events", "stolen"))) == []


def test_a_name_file_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    """A collection's ``.name`` linked to a one-line secret (a token file) would carry
    the secret as the collection's name."""
    root = tmp_path / "chats"
    s = open_store("files", root)
    assert s.append(EVENTS, 1, {"text": "mine"})
    token = tmp_path / "machine" / "token"
    token.parent.mkdir(parents=True)
    token.write_text("hf_not_for_the_agent")
    fake = root / "events" / "fake"
    fake.mkdir()
    os.symlink(token, fake / ".name")
    assert [c.name for c in s.collections()] == ["link:main"]


def test_a_map_entry_or_its_folder_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    root = tmp_path / "chats"
    s = open_store("files", root)
    s.put(NOTES, "plan", {"text": "ship it"})
    d = root / "notes" / encode_name(NOTES.name)
    planted = secret_file(tmp_path, "entry.json")
    planted.write_text(json.dumps({"key": "creds", "value": SECRET}))
    os.symlink(planted, d / "creds.json")
    assert dict(s.items(NOTES)) == {"plan": {"text": "ship it"}}
    assert s.get(NOTES, "creds") is None
    # the whole kind's folder swapped for a link to a copy holding the planted entry
    copy = tmp_path / "machine" / "notes"
    (copy / encode_name(NOTES.name)).mkdir(parents=True)
    (copy / encode_name(NOTES.name) / ".name").write_text(NOTES.name)
    os.replace(planted, copy / encode_name(NOTES.name) / "creds.json")
    os.rename(root / "notes", root / "notes.was")
    os.symlink(copy, root / "notes")
    assert s.collections() == [] and dict(s.items(NOTES)) == {}


@pytest.mark.parametrize("suffix", ["", "-wal"])
def test_a_database_store_reached_through_a_link_is_refused(tmp_path: Path, suffix: str) -> None:
    """Another agent's store (or any database of the machine's) behind a link in this
    agent's ``chats/``: refused in one line naming it, and nothing of it read."""
    theirs = tmp_path / "other-agent" / "store.sqlite"
    t = open_store("sqlite", theirs)
    assert t.append(EVENTS, 1, {"text": "not yours"})
    t.close()
    mine = tmp_path / "chats" / "store.sqlite"
    mine.parent.mkdir()
    if suffix:
        sqlite3.connect(mine).close()
    os.symlink(f"{theirs}{suffix}", f"{mine}{suffix}")
    with pytest.raises(InvalidInput, match=r"is a link, and lnk never opens"):
        open_store("sqlite", mine)


def test_a_store_cloned_at_a_receiver_never_takes_what_a_link_names(tmp_path: Path) -> None:
    """The receiver clones the store the agent left there (hard links, no copy): a link
    the agent planted there while it ran is not followed, or the clone would hold a
    hard link to the machine's file, and the agent could then read and write it."""
    from lnk.agents.stores import clone_chats

    held = tmp_path / "held"
    s = open_store("files", held)
    assert s.append(EVENTS, 1, {"text": "one"})
    s.close()
    target = secret_file(tmp_path, ".bashrc")
    d = held / "events" / encode_name(EVENTS.name)
    os.symlink(target, d / event_file(2))
    os.symlink(target.parent, held / "events" / "elsewhere")
    out = tmp_path / "staged"
    clone_chats(held, out, "files")
    inode = os.stat(target).st_ino
    for p in out.rglob("*"):
        assert p.is_symlink() or os.lstat(p).st_ino != inode, p
    assert not (out / "events" / encode_name(EVENTS.name) / event_file(2)).exists()
    assert [e.data for e in open_store("files", out).iter_events(EVENTS)] == [{"text": "one"}]


# ---- what the agent may write into its store's files: refused in one line, naming it ----
def _planted(tmp_path: Path) -> tuple[Any, Path, Path]:
    """A files store with one event and one note; its events' and notes' folders."""
    root = tmp_path / "chats"
    s = open_store("files", root)
    assert s.append(EVENTS, 1, {"text": "one"})
    s.put(NOTES, "plan", {"text": "ship it"})
    return s, root / "events" / encode_name(EVENTS.name), root / "notes" / encode_name(NOTES.name)


def test_a_store_file_longer_than_any_lnk_writes_is_refused_before_it_is_read_whole(
    tmp_path: Path,
) -> None:
    s, events, _ = _planted(tmp_path)
    with open(events / event_file(2), "wb") as f:  # 64 MiB, sparse: never held in memory
        f.truncate(64 << 20)
    with pytest.raises(InvalidInput, match=r"000000000002\.json is longer than any it writes"):
        list(s.iter_events(EVENTS))


@pytest.mark.parametrize(
    ("where", "data", "match"),
    [
        ("event", b"\xff\xfe not text", r"000000000002\.json: a stored value is not JSON"),
        ("event", b"[1, 2]", r"000000000002\.json: a stored value is not a JSON object"),
        ("entry", b'{"value": {}}', r"plan\.json is not an entry"),
        ("entry", b"\xff", r"plan\.json is not JSON"),
        ("entry", b'{"key": "plan", "value": [1]}', r"plan\.json: a stored value is not a JSON"),
        ("name", b"\xff\xfe", r"/\.name is not UTF-8"),
        ("version", b"3; rm -rf ~", r"/\.version is not a version number"),
        # more digits than int() reads from a text (4,300): a ValueError, not a refusal
        pytest.param("version", b"9" * 5000, r"/\.version is not a version", id="digits"),
    ],
)
def test_a_store_file_lnk_did_not_write_so_is_refused_naming_it(
    tmp_path: Path, where: str, data: bytes, match: str
) -> None:
    s, events, notes = _planted(tmp_path)
    target = {
        "event": events / event_file(2),
        "entry": notes / "plan.json",
        "name": events / ".name",
        "version": notes / ".version",
    }[where]
    target.write_bytes(data)
    with pytest.raises(InvalidInput, match=match):
        if where == "event":
            list(s.iter_events(EVENTS))
        elif where == "entry":
            list(s.items(NOTES))
        elif where == "name":
            s.collections()
        else:
            s.put(NOTES, "next", {"text": "more"})
