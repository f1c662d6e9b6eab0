"""Whole streams that are not what they claim, and streams that clash with what is here."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest
from hostile_kit import OWNER, Dest, dentry, fentry, jl, records, roots, stream

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.settings import new_agent_id
from lnk.payload import manifest as M

ALREADY, REFUSED, STREAM, FORMAT = 4, 6, 10, 11


def test_not_an_lnk_stream(dest: Dest) -> None:
    dest.refuse(b"SSH-2.0-OpenSSH_9.2\r\n" + b"\x00" * 100, STREAM, "not an lnk stream")


def test_an_empty_stream(dest: Dest) -> None:
    dest.refuse(b"", STREAM, "empty")


def test_another_format_number(dest: Dest) -> None:
    data = bytearray(dest.stream(records(dest.head(), roots())))
    data[8:10] = struct.pack(">H", 5)
    dest.refuse(bytes(data), FORMAT, "format 5; this lnk reads format 4")


def test_sealed_to_another_receiver(dest: Dest, fresh: Dest) -> None:
    dest.refuse(stream(fresh.pub, records(dest.head(), roots())), STREAM, "another receiver")


def test_a_manifest_of_another_format(dest: Dest) -> None:
    dest.refuse(
        dest.stream(records(dest.head(manifest="lnk-move-5.json"), roots())),
        FORMAT,
        "lnk-move-5.json",
    )


def test_a_stream_for_another_agent_than_prepared(dest: Dest) -> None:
    h = dest.head(agent={"id": new_agent_id(), "owner": OWNER, "name": "thief"})
    keep = fentry("Home/k", b"mine\n", carry=False)
    dest.refuse(dest.stream(records(h, [*roots(), keep])), STREAM, "prepared for the agent")


def test_a_final_phase_without_its_bulk(dest: Dest) -> None:
    h = dest.head(phase="final", base_stream="0" * 32)
    dest.refuse(dest.stream(records(h, roots())), STREAM, "holds no bulk phase")


def test_an_account_owner_this_machine_is_not(fresh: Dest) -> None:
    aid = fresh.agent_id
    h = fresh.head(agent={"id": aid, "owner": "acct-someone", "name": "work"})
    h["settings"]["owner"] = "acct-someone"
    fresh.refuse(fresh.stream(records(h, roots())), REFUSED, "acct-someone")


def test_a_name_taken_here_by_another_agent(fresh: Dest) -> None:
    registry.create(Machine(fresh.home), "work", agent_id=new_agent_id(), owner=OWNER)
    from hostile_kit import tree

    fresh.before = tree(fresh.home)
    fresh.refuse(fresh.stream(records(fresh.head(), roots())), ALREADY, "already lives here")


def test_a_file_where_home_has_a_link(dest: Dest, tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"untouched")
    os.symlink(tmp_path / "target", dest.agent_root / "Home" / "l")
    from hostile_kit import tree

    dest.before = tree(dest.home)
    data = dest.stream(records(dest.head(), [*roots(), fentry("Home/l", b"over")], b"over"))
    # links travel as links: a file in the stream replaces the link's name, and nothing
    # is ever written through it (docs/stream-format.md)
    p = dest.receive(data)
    assert p.returncode == 0, p.stderr
    placed = dest.agent_root / "Home" / "l"
    assert not placed.is_symlink() and placed.read_bytes() == b"over"
    assert (tmp_path / "target").read_bytes() == b"untouched"


def test_a_folder_where_home_has_a_file(dest: Dest) -> None:
    ents = [*roots(), dentry("Home/docs"), dentry("Home/docs/keep.txt")]
    dest.refuse(dest.stream(records(dest.head(), ents)), REFUSED, "a folder in the stream")


@pytest.mark.parametrize(
    ("coll", "match"),
    [
        ({"kind": "../../etc", "name": "x", "shape": "map"}, "collection is invalid"),
        ({"kind": "notes", "name": "a/../../b", "shape": "map"}, "collection is invalid"),
        ({"kind": "events", "name": "m", "shape": "log", "since": -1}, "collection is invalid"),
        ({"kind": "events", "name": "m", "shape": "log", "since": True}, "collection is invalid"),
    ],
)
def test_collections_with_odd_names(dest: Dest, coll: dict[str, Any], match: str) -> None:
    c = jl({"t": "collection", "v": 1, **coll}, {"t": "end", "count": 0})
    dest.refuse(dest.stream(records(dest.head(), roots(), collections=c)), STREAM, match)


def test_an_end_that_counts_wrong(dest: Dest) -> None:
    c = jl(
        {"t": "collection", "v": 1, "kind": "notes", "name": "n", "shape": "map"},
        {"t": "entry", "key": "k", "value": {}},
        {"t": "end", "count": 5},
    )
    dest.refuse(dest.stream(records(dest.head(), roots(), collections=c)), STREAM, "collection")


def test_a_collection_line_that_is_not_an_object(dest: Dest) -> None:
    dest.refuse(
        dest.stream(records(dest.head(), roots(), collections=b"[1,2]\n")),
        STREAM,
        "not an object",
    )


def test_equal_names_after_folding(dest: Dest) -> None:
    ents = [*roots(), fentry("Home/Stra\u00dfe"), fentry("Home/STRASSE")]
    dest.refuse(dest.stream(records(dest.head(), ents)), STREAM, "case or Unicode normalisation")


def test_a_million_entries_claimed_by_the_summary(dest: Dest) -> None:
    recs = records(dest.head(), roots(), summary=None)
    s = {"entries": 10**6, "files": 0, "data_bytes": 0, "collections": 0, "records": 0}
    dest.refuse(dest.stream([*recs, (M.SUMMARY, M.dump(s))]), STREAM, "the summary says")


@pytest.mark.parametrize(
    "inventory",
    [
        b"LNKINV2\n",
        b"LNKINV2\n\x00\x00",
        b"LNKINV2\n\x00\x00\x00\x05[[[[[",
        b"LNKINV1\n" + b"\x01" * 31,
    ],
)
def test_a_sender_refuses_a_broken_inventory(dest: Dest, fresh: Dest, inventory: bytes) -> None:
    from hostile_kit import lnk

    (dest.home.parent / "inv").write_bytes(inventory)
    p = lnk(
        dest.home,
        "agent",
        "state-send",
        "--to",
        fresh.pub.text(),
        "--inventory",
        str(dest.home.parent / "inv"),
    )
    err = p.stderr.decode()
    assert p.returncode == 5, err
    assert "Traceback" not in err and err.startswith("lnk: error: "), err
