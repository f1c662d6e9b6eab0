"""What only one driver has: SQLite's online backup, the files driver's layout."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from lnk.collections import CollectionId, FileStore, SqliteStore, copy_collection, open_store
from lnk.collections.fileio import encode_name
from lnk.errors import InvalidInput

CONV = CollectionId("events", "link:main")
NOTES = CollectionId("notes", "link:main")


def test_open_store_unknown_driver(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="unknown collection driver"):
        open_store("postgres", tmp_path / "x")


def test_sqlite_backup_while_writing(tmp_path: Path) -> None:
    live = SqliteStore(tmp_path / "live.db")
    live.append_many(CONV, 1, [{"i": i} for i in range(1, 101)])
    live.put(NOTES, "k", {"v": 1})
    live.take_lease(CONV, "h", now_ms=5)
    live.backup_to(tmp_path / "copy.db")
    live.append(CONV, 101, {"i": 101})  # the live one goes on
    copy = SqliteStore(tmp_path / "copy.db")
    assert copy.last_number(CONV) == 100
    assert copy.get(NOTES, "k") == {"v": 1}
    assert copy.read_lease(CONV) is not None
    with sqlite3.connect(tmp_path / "copy.db") as c:
        assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert live.last_number(CONV) == 101


def test_sqlite_is_wal(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "s.db").append(CONV, 1, {})
    with sqlite3.connect(tmp_path / "s.db") as c:
        assert c.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_sqlite_store_survives_fork(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    store.append(CONV, 1, {"who": "parent"})
    pid = os.fork()
    if pid == 0:  # the child must open connections of its own
        code = 0 if store.append(CONV, 2, {"who": "child"}) else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [e.data["who"] for e in store.read(CONV)] == ["parent", "child"]


@pytest.mark.parametrize(
    ("name", "encoded"),
    [
        ("link:main", "link%3Amain"),
        ("..", "%2E%2E"),
        ("a b", "a%20b"),
        ("ok_-9", "ok_-9"),
    ],
)
def test_files_names_encoded(name: str, encoded: str) -> None:
    assert encode_name(name) == encoded


def test_files_long_names_hashed(tmp_path: Path) -> None:
    name = "é" * 200
    enc = encode_name(name)
    assert enc.startswith("~") and len(enc) < 100
    store = FileStore(tmp_path / "f")
    cid = CollectionId("notes", name)
    store.put(cid, name, {"x": 1})
    assert (tmp_path / "f" / "notes" / enc / (enc + ".json")).is_file()
    assert list(store.items(cid)) == [(name, {"x": 1})]
    assert store.collections() == [cid]


def test_files_layout(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "f")
    store.append(CONV, 1, {"a": 1})
    store.take_lease(CONV, "h", now_ms=1)
    d = tmp_path / "f" / "events" / "link%3Amain"
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == [
        "000000000001.json",
        "turn.json",
    ]
    assert not [p for p in d.iterdir() if p.name.startswith(".tmp-")]  # no temporaries left


def test_files_last_number_without_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path / "f", fsync=False)
    store.append_many(CONV, 1, [{} for _ in range(3000)])

    def no_listing(*_a: object, **_k: object) -> None:
        raise AssertionError("last_number listed the directory")

    monkeypatch.setattr(os, "scandir", no_listing)
    monkeypatch.setattr(os, "listdir", no_listing)
    assert store.last_number(CONV) == 3000


def test_files_to_sqlite_and_back_keeps_bytes_equal(tmp_path: Path) -> None:
    f = FileStore(tmp_path / "f")
    s = SqliteStore(tmp_path / "s.db")
    f.append(CONV, 1, {"text": "ünïcödé \u2028 \ud83d\ude00", "n": 2**80, "x": -0.0})
    copy_collection(f, s, CONV)
    back = FileStore(tmp_path / "back")
    copy_collection(s, back, CONV)
    assert (tmp_path / "f/events/link%3Amain/000000000001.json").read_bytes() == (
        tmp_path / "back/events/link%3Amain/000000000001.json"
    ).read_bytes()
