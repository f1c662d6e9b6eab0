"""The adapter contract's answers (``docs/adapters.md``, contract version 1), typed.

An adapter is a program, ``lnk-<harness>``, whose every answer is one JSON object
on its standard output.  Each answer is parsed here ONCE, into a frozen
dataclass, and refused whole with one :class:`AdapterError` naming the adapter,
the command and the first field that did not fit: a wrong type, a text with a
control character (a terminal escape, ``\\r``, a C1 control, a bidirectional
override), a path with ``..``, a path outside the agent's folders.  Past this
module the fields are what ``mypy --strict`` says they are.

Paths an adapter names on disk are checked on disk too (:func:`check_state_path`,
:func:`check_write_dir`): no component may be a symbolic link.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnk.agents.layout import AgentFolders
from lnk.errors import InvalidInput

CONTRACT_VERSION = 1
MAX_ANSWER = 1 << 20  # bytes of one answer
MAX_TEXT = 4096  # characters of one text field
MAX_LIST = 256  # entries of one list
HARNESS_DIR = "harness"  # Agent/harness/: an adapter's harness's home, a file root
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
ENV_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
STATE_KINDS = ("file", "dir", "sqlite")
HOST_ONLY = ("/proc", "/sys", "/dev", "/run")  # never shown to a sandbox from the host
# what an adapter may ask of the sandbox (needs): lnk grants these and nothing else
KNOWN_NEEDS = ("model", "harness-home", "tools")
_BIDI = frozenset({0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)})


class AdapterError(InvalidInput):
    """An adapter's answer that is not what the contract says."""


def _clean(text: str) -> bool:
    return not any(
        ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) <= 0xDFFF or ord(c) in _BIDI
        for c in text
    )


@dataclass(frozen=True)
class Reader:
    """One answer being read: who gave it, for the error's words."""

    adapter: str
    command: str

    def fail(self, why: str) -> AdapterError:
        return AdapterError(
            f"the adapter lnk-{self.adapter} answered {self.command} wrongly: {why}",
            hint=f"update or remove lnk-{self.adapter}; lnk runs no harness on an answer "
            "it can't trust (docs/adapters.md)",
        )

    def document(self, raw: bytes) -> dict[str, Any]:
        if len(raw) > MAX_ANSWER:
            raise self.fail(f"its answer is over {MAX_ANSWER} bytes")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise self.fail("its answer is not one JSON object") from e
        if not isinstance(doc, dict):
            raise self.fail("its answer is not one JSON object")
        return doc

    def text(self, doc: dict[str, Any], key: str, default: str | None = None) -> str:
        v = doc.get(key, default)
        if not isinstance(v, str):
            raise self.fail(f"{key} is not a text")
        if len(v) > MAX_TEXT or not _clean(v):
            raise self.fail(f"{key} holds a control character or is too long")
        return v

    def integer(self, doc: dict[str, Any], key: str) -> int:
        v = doc.get(key)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.fail(f"{key} is not a whole number")
        return v

    def flag(self, doc: dict[str, Any], key: str, default: bool = False) -> bool:
        v = doc.get(key, default)
        if not isinstance(v, bool):
            raise self.fail(f"{key} is not true or false")
        return v

    def texts(self, doc: dict[str, Any], key: str) -> tuple[str, ...]:
        v = doc.get(key, [])
        if not isinstance(v, list) or len(v) > MAX_LIST:
            raise self.fail(f"{key} is not a list of at most {MAX_LIST}")
        return tuple(self.text({key: x}, key) for x in v)

    def objects(self, doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
        v = doc.get(key, [])
        if not isinstance(v, list) or len(v) > MAX_LIST or not all(isinstance(x, dict) for x in v):
            raise self.fail(f"{key} is not a list of at most {MAX_LIST} objects")
        return v

    def abs_path(self, value: str, what: str) -> str:
        if not value.startswith("/") or ".." in value.split("/") or "\\" in value:
            raise self.fail(f"{what} {value!r} is not an absolute path without '..'")
        return os.path.normpath(value)


def _under(path: str, root: Path) -> bool:
    r = str(root)
    return path == r or path.startswith(r.rstrip("/") + "/")


def _no_links(path: Path, top: Path) -> bool:
    """Whether no component from ``top`` down to ``path`` is a symbolic link (a missing
    one is no link)."""
    cur = top
    for part in path.relative_to(top).parts:
        cur = cur / part
        try:
            if stat.S_ISLNK(os.lstat(cur).st_mode):
                return False
        except FileNotFoundError:
            return True
    return True


@dataclass(frozen=True)
class Describe:
    name: str
    adapter: str  # the adapter's release
    harness: str  # the harness's release
    contract: int

    @classmethod
    def parse(cls, raw: bytes, adapter: str) -> Describe:
        r = Reader(adapter, "describe")
        doc = r.document(raw)
        d = cls(r.text(doc, "name"), r.text(doc, "adapter"), r.text(doc, "harness"), 0)
        contract = r.integer(doc, "contract")
        if d.name != adapter:
            raise r.fail(f"it names itself {d.name!r}")
        if contract != CONTRACT_VERSION:
            raise AdapterError(
                f"the adapter lnk-{adapter} speaks contract {contract}; this lnk speaks "
                f"{CONTRACT_VERSION}",
                hint="update the older of the two",
            )
        return cls(d.name, d.adapter, d.harness, contract)


@dataclass(frozen=True)
class Needs:
    needs: tuple[str, ...]

    @classmethod
    def parse(cls, raw: bytes, adapter: str) -> Needs:
        r = Reader(adapter, "needs")
        return cls(r.texts(r.document(raw), "needs"))


@dataclass(frozen=True)
class Hosts:
    hosts: tuple[str, ...]

    @classmethod
    def parse(cls, raw: bytes, adapter: str) -> Hosts:
        r = Reader(adapter, "internet-hosts")
        hosts = r.texts(r.document(raw), "hosts")
        for h in hosts:
            if not re.fullmatch(r"[A-Za-z0-9.-]{1,253}", h):
                raise r.fail(f"the host {h!r} is not a host name")
        return cls(hosts)


@dataclass(frozen=True)
class Installed:
    root: str  # the installed harness's folder: read-only in the sandbox
    harness: str

    @classmethod
    def parse(cls, raw: bytes, adapter: str) -> Installed:
        r = Reader(adapter, "install")
        doc = r.document(raw)
        root = r.abs_path(r.text(doc, "root"), "root")
        if not os.path.isdir(root):
            raise r.fail(f"root {root!r} is not a folder")
        return cls(root, r.text(doc, "harness"))


@dataclass(frozen=True)
class Configured:
    changed: bool
    home: str  # the harness's home: Agent/harness or under it

    @classmethod
    def parse(cls, raw: bytes, adapter: str, folders: AgentFolders) -> Configured:
        r = Reader(adapter, "configure")
        doc = r.document(raw)
        home = check_write_dir(r, r.abs_path(r.text(doc, "home"), "home"), folders)
        return cls(r.flag(doc, "changed"), home)


@dataclass(frozen=True)
class StatePath:
    path: str  # relative to the agent's folder, e.g. "Agent/harness/state.db"
    kind: str  # "file", "dir" or "sqlite"


@dataclass(frozen=True)
class State:
    paths: tuple[StatePath, ...]

    @classmethod
    def parse(cls, raw: bytes, adapter: str, folders: AgentFolders) -> State:
        r = Reader(adapter, "state")
        out = []
        for row in r.objects(r.document(raw), "paths"):
            kind = r.text(row, "kind")
            if kind not in STATE_KINDS:
                raise r.fail(f"the kind {kind!r} is not one of {', '.join(STATE_KINDS)}")
            out.append(StatePath(check_state_path(r, r.text(row, "path"), folders), kind))
        return cls(tuple(out))


@dataclass(frozen=True)
class Endpoint:
    argv: tuple[str, ...]  # the program that answers at the endpoint, and its arguments
    env: tuple[tuple[str, str], ...]
    read: tuple[str, ...]  # folders outside the agent's it needs to read (its install)
    write: tuple[str, ...]  # folders under Agent/harness it writes
    proof: bool  # it answers /_link/proof (contract: yes, or lnk refuses to start it)

    @classmethod
    def parse(cls, raw: bytes, adapter: str, folders: AgentFolders, home: Path) -> Endpoint:
        r = Reader(adapter, "endpoint")
        doc = r.document(raw)
        argv = r.texts(doc, "argv")
        if not argv or not argv[0].startswith("/"):
            raise r.fail("argv does not start with an absolute program path")
        env_doc = doc.get("env", {})
        if not isinstance(env_doc, dict) or len(env_doc) > MAX_LIST:
            raise r.fail("env is not an object")
        env = []
        for k in sorted(env_doc):
            if not ENV_RE.fullmatch(k):
                raise r.fail(f"the variable name {k!r} is not NAME_LIKE_THIS")
            env.append((k, r.text(env_doc, k)))
        read = tuple(
            check_read_dir(r, r.abs_path(p, "read"), folders, home) for p in r.texts(doc, "read")
        )
        write = tuple(
            check_write_dir(r, r.abs_path(p, "write"), folders) for p in r.texts(doc, "write")
        )
        return cls(argv, tuple(env), read, write, r.flag(doc, "proof"))


def check_state_path(r: Reader, rel: str, folders: AgentFolders) -> str:
    """A state path: relative, no ``..``, under the agent's ``Agent/`` or ``Home/``
    (what a move and a backup carry), no component a symbolic link."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise r.fail(f"the state path {rel!r} is not a plain relative path")
    if not (rel.startswith(f"Agent/{HARNESS_DIR}/") or rel == f"Agent/{HARNESS_DIR}") and not (
        rel.startswith("Home/")
    ):
        raise r.fail(f"the state path {rel!r} is outside the agent's folders a move carries")
    if not _no_links(folders.root / rel, folders.root):
        raise r.fail(f"the state path {rel!r} is or goes through a symbolic link")
    return rel


def check_write_dir(r: Reader, path: str, folders: AgentFolders) -> str:
    """A folder the harness writes: Agent/harness or under it, through no link."""
    top = folders.agent / HARNESS_DIR
    if not _under(path, top):
        raise r.fail(f"{path!r} is outside the agent's {top}")
    if not _no_links(Path(path), folders.root):
        raise r.fail(f"{path!r} is or goes through a symbolic link")
    return path


def check_read_dir(r: Reader, path: str, folders: AgentFolders, home: Path) -> str:
    """A folder outside the agent's the harness reads (its install): never HOME or one
    of its ancestors, never lnk's settings, state or another agent's folders, unless it
    is the machine's tools folder (``~/.lnk/tools``)."""
    tools = home / ".lnk" / "tools"
    # the host's processes (their environments: lnk's runner holds the model's key),
    # devices and runtime files, or the machine's shared /tmp, over the sandbox's own
    if any(_under(path, Path(p)) for p in HOST_ONLY) or path == "/tmp":
        raise r.fail(f"read {path!r} would show the host's {path} in the sandbox")
    if _under(str(home), Path(path)):
        raise r.fail(f"read {path!r} would show all of HOME")
    if _under(path, home) and not _under(path, tools):
        raise r.fail(f"read {path!r} is in HOME outside lnk's tools folder {tools}")
    if _under(path, folders.root):
        raise r.fail(f"read {path!r} is in the agent's folders")
    if not os.path.isdir(path) or not _no_links(Path(path), Path("/")):
        raise r.fail(f"read {path!r} is not a folder reached through no link")
    return path
