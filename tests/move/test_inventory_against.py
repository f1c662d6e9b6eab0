"""A receiver's inventory taken against the sender's folder digests (stream-format 7.7).

The agent lives on box b1 and left its folders here when it moved there: a
receiver here has a base.  ``state-digests`` at b1, piped into
``state-receive --inventory --against -`` here: an unchanged agent's inventory
names its outermost folders and no file's content; one changed file lists only
the content of the folders on its way (not its untouched neighbours'); a hostile
digests input is refused with one error line.  Real lnk commands, local boxes.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from move_helpers import AGENT, World, make_agent

from lnk.payload.inventory import Inventory

FOLDERS = ("proj/a", "proj/b", "notes")
PER_FOLDER = 20


def run(world: World, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, **world.env, "HOME": str(world.here)}
    cmd = [sys.executable, "-c", "from lnk.cli.main import main; main()", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, env=env, timeout=120)


def fill(home: Path) -> dict[str, str]:
    """Files with distinct content in three folders; their path -> content."""
    made = {}
    for folder in FOLDERS:
        for i in range(PER_FOLDER):
            p = home / "Link" / "Agents" / AGENT / "Home" / folder / f"f{i}.txt"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"{folder} {i}\n" * 10)
            made[f"Home/{folder}/f{i}.txt"] = p.read_text()
    return made


@pytest.fixture
def moved(world: World) -> tuple[World, str]:
    """The agent, with its files, moved from here to b1 (its folders kept here)."""
    agent_id = make_agent(world)
    fill(world.here)
    world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
    return world, agent_id


def prepare(world: World, agent_id: str) -> dict[str, Any]:
    r = run(world, "agent", "state-receive", "--prepare", "--agent-id", agent_id, "--json")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def digests(world: World) -> bytes:
    r = world.ok("box", "run", "b1", "--", "agent", "state-digests", "--agent", AGENT, "--json")
    return r.out.encode()


def inventory(world: World, rid: str, against: bytes | None) -> Inventory:
    args = ["agent", "state-receive", "--inventory", "--receiver", rid]
    r = (
        run(world, *args, "--against", "-", stdin=against)
        if against is not None
        else run(world, *args)
    )
    assert r.returncode == 0, r.stderr
    return Inventory.from_bytes(r.stdout)


def test_unchanged_the_inventory_names_folders_not_files(moved: tuple[World, str]) -> None:
    world, agent_id = moved
    prep = prepare(world, agent_id)
    assert prep["folders"] > 0
    full = inventory(world, prep["receiver"], None)
    theirs = json.loads(digests(world))
    assert theirs["id"] == agent_id and "Home/proj/a" in theirs["dirs"]
    small = inventory(world, prep["receiver"], json.dumps(theirs).encode())
    assert len(full) >= len(FOLDERS) * PER_FOLDER
    home_files = [d for d in small.dirs if d.startswith("Home")]
    assert home_files == ["Home"]  # the one outermost folder of Home, held alike
    assert len(theirs["dirs"]["Home"]) == 24  # a receiver picks by the first 24 hex digits
    assert small.dirs["Home"].startswith(theirs["dirs"]["Home"]) and len(small.dirs["Home"]) == 64
    assert len(small) <= len(full) - len(FOLDERS) * PER_FOLDER  # no Home file's content
    assert len(small.to_bytes()) * 5 < len(full.to_bytes())
    # the sender's file-system clock as its walk began, given back for the send
    assert theirs["at"] > 0 and small.at == theirs["at"] and full.at == 0


def test_one_changed_file_lists_only_its_folders_content(moved: tuple[World, str]) -> None:
    world, agent_id = moved
    prep = prepare(world, agent_id)
    changed = world.boxes["b1"] / "Link" / "Agents" / AGENT / "Home" / "proj" / "a" / "f3.txt"
    changed.write_text("changed\n")
    theirs = json.loads(digests(world))
    inv = inventory(world, prep["receiver"], json.dumps(theirs).encode())
    here = world.here / "Link" / "Moved"
    assert "Home" not in inv.dirs and "Home/proj" not in inv.dirs and "Home/proj/a" not in inv.dirs
    assert "Home/proj/b" in inv.dirs and "Home/notes" in inv.dirs
    full = inventory(world, prep["receiver"], None)
    # Home/proj/a's files are listed (the sender will send that folder's entries) ...
    sha = {f"Home/{f}/f{i}.txt": _sha(f, i) for f in FOLDERS for i in range(PER_FOLDER)}
    for i in range(PER_FOLDER):
        assert sha[f"Home/proj/a/f{i}.txt"] in inv
    # ... and none of the untouched folders' files
    for f in ("proj/b", "notes"):
        for i in range(PER_FOLDER):
            assert sha[f"Home/{f}/f{i}.txt"] in full
            assert sha[f"Home/{f}/f{i}.txt"] not in inv
    assert here.is_dir()


def _sha(folder: str, i: int) -> str:
    import hashlib

    return hashlib.sha256((f"{folder} {i}\n" * 10).encode()).hexdigest()


HOSTILE = [
    b"not json",
    b"[]",
    b'{"agent": "work", "id": "x"}',
    b'{"agent": "work", "id": "x", "dirs": {"Home": "zz"}}',
    b'{"agent": "work", "id": "x", "dirs": {"../etc": "' + b"0" * 64 + b'"}}',
    b'{"agent": "work", "id": "x", "dirs": {"/abs": "' + b"0" * 64 + b'"}}',
    b'{"agent": "work", "id": "x", "dirs": {"Home//a": "' + b"0" * 64 + b'"}}',
    b'{"agent": "work", "id": "x", "dirs": {"Home": 5}}',
    b'{"agent": "work", "id": "x", "dirs": []}',
    b"[" * 100_000,
    b'{"agent": "work", "id": "x", "dirs": {}, "at": -1}',
    b'{"agent": "work", "id": "x", "dirs": {}, "at": "now"}',
    b'{"agent": "work", "id": "x", "dirs": {}, "at": 1e30}',
    b'{"agent": "work", "id": "x", "dirs": {}, "at": 99999999999999999999}',
]


def test_hostile_digests_are_refused_with_one_line(moved: tuple[World, str]) -> None:
    world, agent_id = moved
    prep = prepare(world, agent_id)
    args = ["agent", "state-receive", "--inventory", "--receiver", prep["receiver"]]
    for bad in HOSTILE:
        r = run(world, *args, "--against", "-", stdin=bad)
        err = r.stderr.decode()
        assert r.returncode != 0 and not r.stdout, bad[:60]
        assert "Traceback" not in err
        assert len(re.findall(r"(?m)^lnk: error:", err)) == 1, err
        assert "folder digests" in err, err
    # the receiver is as it was: a good one still answers
    assert len(inventory(world, prep["receiver"], digests(world))) <= 2


def test_a_move_back_leaves_b1_with_the_note_its_final_send_made(
    moved: tuple[World, str],
) -> None:
    """Moving back here: b1's final send noted every folder's listing (its inventory
    held this computer's kept folders' digests), and b1 adopted that note when it let
    the agent go (``moved-away --final``), rather than walking its files again."""

    world, agent_id = moved
    world.ok("agent", "move", "--agent", AGENT, "--here")
    [kept] = (world.boxes["b1"] / "Link" / "Moved").glob(f"{AGENT}-*")
    con = sqlite3.connect(kept / ".lnk-hashes.sqlite")
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        listed = dict(con.execute("SELECT dir, keys FROM left_dirs"))
    finally:
        con.close()
    assert "left_dirs" in tables and "left" not in tables and "sent_by" not in tables
    assert {"Home/proj/a", "Home/proj/b", "Home/notes"} <= set(listed)
    assert listed["Home/proj/a"].count(b"\n") == PER_FOLDER
    # and back to b1, onto that kept folder: its cache becomes the agent's, without the note
    world.ok("agent", "move", "--agent", AGENT, "--to", "b1")
    cache = world.boxes["b1"] / ".lnk" / "agents" / agent_id / "hashes.sqlite"
    con = sqlite3.connect(cache)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        rows = con.execute("SELECT COUNT(*) FROM h2").fetchone()[0]
    finally:
        con.close()
    assert "h2" in tables and not tables & {"left", "left_dirs", "sent_dirs", "sent_by"}
    assert rows >= 2 * PER_FOLDER  # the kept folder's rows came with it
    assert not kept.exists()  # (its cache taken, the rest gone at the commit)
