"""Helpers for the agent backup tests: agents to back up, what to compare, bucket wrappers."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.registry import Agent
from lnk.agents.stores import open_agent_store
from lnk.backup import agent_keys
from lnk.collections import CollectionId
from lnk.payload.manifest import FILE_ROOTS
from lnk.transport.buckets import Bucket, ObjectInfo

EVENTS = CollectionId("events", "link:main")
NOTES = CollectionId("notes", "link:main")
GRANTS = '[files]\nwrite = ["."]\nread = ["docs"]\n\n[internet]\nhosts = ["example.com"]\n'


def write(path: Path, data: bytes, mode: int | None = None, mtime_ns: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mode is not None:
        os.chmod(path, mode)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def sample_agent(machine: Machine, name: str = "work", big: int = 0) -> Agent:
    a = registry.create(machine, name)
    h = a.folders.home
    write(h / "docs" / "report.txt", b"the report\n", 0o640, 1_600_000_000_123_456_789)
    write(h / "empty", b"", 0o600)
    write(h / "run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    os.link(h / "docs" / "report.txt", h / "report-link.txt")
    os.chmod(h / "docs", 0o750)
    write(a.folders.agent / "memory" / "facts.md", b"water is wet\n")
    write(a.folders.agent / "instructions" / "main.md", b"be kind\n", 0o640)
    if big:
        write(h / "big.bin", os.urandom(big))
    a.folders.sandbox_toml.write_text(GRANTS)
    a.settings.lapse_s = 45
    a.save()
    s = open_agent_store(a.folders.chats, a.settings.store)
    try:
        for i in range(5):
            assert s.append(EVENTS, i + 1, {"role": "user", "text": f"message {i}"})
        s.put(NOTES, "plan", {"text": "ship it"})
    finally:
        s.close()
    return registry.find(machine, name)


def age(agent: Agent, seconds: int = 3600) -> None:
    """Put every file of the agent ``seconds`` in the past: a backup caches what it reads
    only from files not changed in the last two seconds (a change within the clock's
    step of the read would not show in the stat)."""
    when = time.time_ns() - seconds * 1_000_000_000
    for r in FILE_ROOTS:
        top = agent.folders.root / r
        for p in top.rglob("*") if top.is_dir() else ():
            if p.is_file() and not p.is_symlink():
                os.utime(p, ns=(when, when))


def source_tree(a: Agent, pkgs: int, mods: int) -> None:
    """Home/src: ``pkgs`` packages of ``mods`` modules each under pkgN/mod/, a README, a
    link in pkg1 to it, and one module of pkg2 with another mode (no file aged yet)."""
    h = a.folders.home
    for d in range(pkgs):
        for i in range(mods):
            write(h / "src" / f"pkg{d}" / "mod" / f"m{i}.py", f"x = {d * 10 + i}\n".encode())
    write(h / "src" / "README", b"read me\n")
    os.symlink("../README", h / "src" / "pkg1" / "alias.py")
    os.chmod(h / "src" / "pkg2" / "mod" / "m1.py", 0o640)


def agent_files(root: Path) -> dict[str, tuple[Any, ...]]:
    out: dict[str, tuple[Any, ...]] = {}
    for r in FILE_ROOTS:
        top = root / r
        for p in sorted(top.rglob("*")) if top.is_dir() else ():
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = (
                    "f",
                    stat.S_IMODE(st.st_mode),
                    st.st_mtime_ns,
                    hashlib.sha256(p.read_bytes()).hexdigest(),
                )
    return out


def link_groups(root: Path) -> set[frozenset[str]]:
    by: dict[tuple[int, int], set[str]] = {}
    for p in root.rglob("*"):
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode) and "chats" not in p.parts:
            by.setdefault((st.st_dev, st.st_ino), set()).add(str(p.relative_to(root)))
    return {frozenset(g) for g in by.values() if len(g) > 1}


def collections_of(agent: Agent) -> dict[str, list[dict[str, Any]]]:
    s = open_agent_store(agent.folders.chats, agent.settings.store)
    try:
        return {f"{c.kind}/{c.name}": list(s.export(c)) for c in s.collections()}
    finally:
        s.close()


def give_keys(src: Machine, dst: Machine, *, private: bool = True) -> None:
    keys = agent_keys.load(src)
    assert keys is not None
    agent_keys.import_keys(dst, agent_keys.parse_text(agent_keys.export_text(keys, private)))


class Recording(Bucket):
    """A real bucket that records every call, and can fail after ``fail_after`` puts."""

    def __init__(self, inner: Bucket, fail_after: int | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.calls: list[str] = []
        self.puts: list[str] = []
        self.put_bytes = 0
        self.fail_after = fail_after

    def put(self, key: str, data: bytes) -> None:
        if self.fail_after is not None and len(self.puts) >= self.fail_after:
            raise KeyboardInterrupt("killed mid-backup")
        self.calls.append(f"put {key}")
        self.puts.append(key)
        self.put_bytes += len(data)
        self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        self.calls.append(f"get {key}")
        return self.inner.get(key)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.calls.append(f"get {key} {start}+{length}")
        return self.inner.get_range(key, start, length)

    def exists(self, key: str) -> bool:
        self.calls.append(f"exists {key}")
        return self.inner.exists(key)

    def entries(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self.calls.append(f"list {prefix}")
        return self.inner.entries(prefix)

    def delete(self, key: str) -> None:
        self.calls.append(f"delete {key}")
        self.inner.delete(key)

    def labels(self) -> dict[str, str]:
        self.calls.append("labels")
        return self.inner.labels()

    def set_label(self, name: str, value: str) -> None:
        self.calls.append("set_label")
        self.inner.set_label(name, value)

    def describe(self) -> str:
        return self.inner.describe()
