"""The property: a re-send against the receiver's base gives exactly what a full send gives.

Random trees, then random edits (add, change, remove, rename, hard-link, change mode,
symbolic link, a folder moved); the agent is sent again to the machine that holds its earlier copy
(with that machine's inventory, whole or taken against the sender's folder
digests as a move takes it) and, whole, to a machine that never saw it. Both end
with the same agent; the re-sent one keeps, besides, only the Home files the agent
no longer has (a receive adds to Home, never deletes).
"""

from __future__ import annotations

import os
import random
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from payload_helpers import (
    agent_files,
    link_groups,
    load_agent,
    make_agent,
    move,
    prepare,
    write,
)

from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.payload import unchanged
from lnk.payload.folders import clock, sending_digests
from lnk.payload.receive import receive
from lnk.payload.send import send_agent

OLD = 1_600_000_000_000_000_000
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-é", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..") and not s.startswith("-")
)
SIZES = st.sampled_from([0, 1, 17, 4096, 70_000])
FILE = st.tuples(SIZES, st.integers(0, 2**32))
TREE = st.recursive(
    st.dictionaries(NAMES, FILE, max_size=4),
    lambda inner: st.dictionaries(NAMES, st.one_of(FILE, inner), max_size=3),
    max_leaves=10,
)
EDIT = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 99), NAMES, SIZES, st.integers(0, 2**32)),
    st.tuples(st.just("change"), st.integers(0, 99), st.integers(0, 2**32)),
    st.tuples(st.just("remove"), st.integers(0, 99)),
    st.tuples(st.just("rename"), st.integers(0, 99), NAMES),
    st.tuples(st.just("hardlink"), st.integers(0, 99), NAMES),
    st.tuples(st.just("chmod"), st.integers(0, 99), st.integers(0, 0o77)),
    st.tuples(
        st.just("symlink"), st.integers(0, 99), NAMES, st.sampled_from(["x", "../up", "/abs"])
    ),
)


# a folder moved (renamed, perhaps into another): its files keep their change times
MOVE_DIR = st.tuples(st.just("movedir"), st.integers(0, 99), st.integers(0, 99), NAMES)


def _build(root: Path, spec: dict[str, Any]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, v in spec.items():
        p = root / name
        if isinstance(v, dict):
            _build(p, v)
        else:
            size, seed = v
            # an old mtime: the hash caches vouch for it, so folders have digests
            write(p, random.Random(seed).randbytes(size), 0o644, OLD + seed % 997)


def _files(home: Path) -> list[Path]:
    return sorted(p for p in home.rglob("*") if p.is_file() and not p.is_symlink())


def _dirs(home: Path) -> list[Path]:
    return [home, *sorted(p for p in home.rglob("*") if p.is_dir() and not p.is_symlink())]


def _edit(home: Path, edits: list[tuple[Any, ...]]) -> None:
    for op, i, *rest in edits:
        files, dirs = _files(home), _dirs(home)
        if op == "movedir":
            if len(dirs) < 2:
                continue
            d, to = dirs[1:][i % (len(dirs) - 1)], dirs[rest[0] % len(dirs)] / rest[1]
            if not (os.path.lexists(to) or to.is_relative_to(d)):
                d.rename(to)
            continue
        if op == "add" or op == "symlink":
            d = dirs[i % len(dirs)]
            p = d / rest[0]
            if os.path.lexists(p):
                continue
            if op == "add":
                write(p, random.Random(rest[2]).randbytes(rest[1]), 0o644, OLD)
            else:
                os.symlink(rest[1], p)
            continue
        if not files:
            continue
        f = files[i % len(files)]
        if op == "change":
            f.write_bytes(random.Random(rest[0]).randbytes(100 + rest[0] % 5000))
        elif op == "remove":
            f.unlink()
        elif op == "rename":
            new = f.parent / rest[0]
            if not os.path.lexists(new):
                f.rename(new)
        elif op == "hardlink":
            new = f.parent / f"{rest[0]}.hl"
            if not os.path.lexists(new):
                os.link(f, new)
        elif op == "chmod":
            os.chmod(f, 0o600 | rest[0])


def _moved(tmp: str, tree: dict[str, Any], skills: dict[str, Any]) -> tuple[Agent, Machine]:
    """An agent of these trees, moved whole to a second machine: (the agent, it)."""
    src, dst = Machine(Path(tmp) / "a"), Machine(Path(tmp) / "b")
    a = make_agent(src)
    _build(a.folders.home, tree)
    _build(a.folders.agent / "skills", skills)
    move(a, dst)
    return a, dst


def _as_a_full_send_gives(a: Agent, dst: Machine, before: dict[str, Any], tmp: str) -> None:
    """What ``dst`` holds after the re-send is what a whole send to a third machine
    gives; besides, only the Home files the agent no longer has (as ``before`` had them);
    hard-link groups one inode, a link a link."""
    fresh = Machine(Path(tmp) / "c")
    move(a, fresh)
    again = agent_files(load_agent(dst).folders.root)
    whole = agent_files(load_agent(fresh).folders.root)
    assert whole == agent_files(a.folders.root)
    for p, v in whole.items():
        assert again.get(p) == v, p
    for p in set(again) - set(whole):  # only Home keeps what the agent no longer has
        assert p.startswith("Home/") and again[p] == before.get(p), p
    b_root = load_agent(dst).folders.root
    for group in link_groups(load_agent(fresh).folders.root):
        inodes = {os.lstat(b_root / p).st_ino for p in group}
        assert len(inodes) == 1, group
    for p, v in whole.items():  # kinds agree on disk (a link is a link, never followed)
        assert stat.S_ISLNK(os.lstat(b_root / p).st_mode) == (v[0] == "l")


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    tree=TREE,
    skills=TREE,
    edits=st.lists(st.one_of(EDIT, MOVE_DIR), max_size=8),
    against=st.booleans(),
)
def test_a_resend_against_the_base_gives_what_a_full_send_gives(
    tree: dict[str, Any], skills: dict[str, Any], edits: list[tuple[Any, ...]], against: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        a, dst = _moved(tmp, tree, skills)
        before = agent_files(load_agent(dst).folders.root)
        _edit(a.folders.home, edits)
        _edit(a.folders.agent / "skills", edits[::-1])
        # with ``against``, the inventory a move takes: against the sender's folder digests
        srep, rep = move(a, dst, agent_id=a.id, inventory=True, against=against)
        assert rep.committed
        if not edits:  # nothing changed: every root goes as one entry, held there whole
            assert srep.kept_folders == srep.entries and srep.data_bytes == 0
        _as_a_full_send_gives(a, dst, before, tmp)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(tree=TREE, skills=TREE, edits=st.lists(st.one_of(EDIT, MOVE_DIR), max_size=8))
def test_edits_after_the_inventory_still_give_what_a_full_send_gives(
    tree: dict[str, Any], skills: dict[str, Any], edits: list[tuple[Any, ...]]
) -> None:
    """The same, with the edits made *after* the inventory was taken against the
    sender's digests (the agent writes while it moves), folders moved too: the sender
    then tells what is unchanged since by change times (lnk/payload/unchanged.py), and
    whatever the edits, the stream is never refused and what arrives is the agent as
    it is."""
    with tempfile.TemporaryDirectory() as tmp:
        a, dst = _moved(tmp, tree, skills)
        before = agent_files(load_agent(dst).folders.root)
        time.sleep(2 * unchanged.MARGIN_NS / 1e9)  # what is there is older than the margin
        r = prepare(dst, a.id)
        at = clock(a.folders.root)
        inv = r.inventory(sending_digests(a.folders.root, a.runtime / "hashes.sqlite"), at=at)
        assert at > 0
        _edit(a.folders.home, edits)
        _edit(a.folders.agent / "skills", edits[::-1])
        path = Path(tmp) / "stream"
        with open(path, "wb") as f:
            srep = send_agent(a, f, r.key().public, inventory=inv)
        with open(path, "rb") as f:
            assert receive(dst, r.rid, f).committed
        if not edits:
            assert srep.data_bytes == 0
        _as_a_full_send_gives(a, dst, before, tmp)


BIG = 24_000  # files under Home/big: more than folders.WHOLE_MAX


def test_a_resend_against_the_digests_keeps_a_big_tree_whole() -> None:
    """More files in Home than an inventory names as one folder (folders.WHOLE_MAX): the
    inventory names the folders it will surely keep whole (not Home, too big), so an
    unchanged re-send carries no byte, and one changed file carries only itself."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Machine(Path(tmp) / "a"), Machine(Path(tmp) / "b")
        a = make_agent(src)
        for i in range(BIG):
            p = a.folders.home / "big" / f"d{i // 200:03d}" / f"f{i}.txt"
            write(p, f"{i}\n".encode(), mtime_ns=OLD)  # old: the hash cache vouches for it
        move(a, dst)
        srep, rep = move(a, dst, agent_id=a.id, inventory=True, against=True)
        assert rep.committed and srep.data_bytes == 0
        assert srep.kept_folders >= BIG // 200
        changed = a.folders.home / "big" / "d007" / "f1400.txt"
        changed.write_bytes(b"changed\n")
        srep, rep = move(a, dst, agent_id=a.id, inventory=True, against=True)
        assert rep.committed and srep.data_bytes == len(b"changed\n")
        assert (load_agent(dst).folders.home / "big" / "d007" / "f1400.txt").read_bytes() == (
            b"changed\n"
        )
