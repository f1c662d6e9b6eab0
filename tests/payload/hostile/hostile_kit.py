"""Tools for the hostile-input corpus: forge streams, feed them to the real ``lnk``.

Streams are built with the format's own primitives (``lnk.formats.header``
and ``lnk.formats.records``: the header, the per-record sealing) so a case
may put anything at any place: a record of a reserved type, a codec byte
nobody defined, a zstd frame that lies about its size, a record spliced from
another stream, a final record that counts wrong.  Every case is received by ``lnk agent state-receive`` in a
subprocess, as a person would run it, and judged by what that person sees: one
``lnk: error:`` line (and at most a hint), the exit code of ``lnk.errors``, no
traceback, and a destination that did not change.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from lnk.formats import header as H
from lnk.formats import records as R
from lnk.formats.keys import PublicKey, parse_public_key
from lnk.payload import manifest as M

OWNER = "local-hostile"
ROOTS = ("Home", "Agent/instructions", "Agent/skills", "Agent/memory", "Agent/schedule")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dump(obj: Any) -> bytes:
    """Compact JSON as a writer sends it; lone surrogates go as ``\\udXXX`` escapes."""
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


# ---- entries and heads ------------------------------------------------------------------
def fentry(
    path: str,
    data: bytes = b"",
    *,
    mode: int = 0o644,
    carry: bool | None = None,
    group: int | None = None,
    **over: Any,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "p": path,
        "t": "f",
        "m": mode,
        "s": len(data),
        "h": sha(data),
        "d": bool(data) if carry is None else carry,
        "mt": 1_700_000_000_000_000_000,
    }
    if group is not None:
        e["g"] = group
    e.update(over)
    return e


def dentry(path: str, mode: int = 0o755, **over: Any) -> dict[str, Any]:
    return {"p": path, "t": "d", "m": mode, **over}


def roots() -> list[dict[str, Any]]:
    return [dentry(r) for r in ROOTS]


def settings(agent_id: str, name: str = "work", owner: str = OWNER) -> dict[str, Any]:
    return {
        "format": 2,
        "id": agent_id,
        "name": name,
        "owner": owner,
        "harness": "builtin",
        "sandbox": True,
        "store": "files",
    }


def head(agent_id: str, name: str = "work", owner: str = OWNER, **over: Any) -> dict[str, Any]:
    h: dict[str, Any] = {
        "manifest": M.MANIFEST_NAME,
        "format": 4,
        "agent": {"id": agent_id, "owner": owner, "name": name},
        "settings": settings(agent_id, name, owner),
        "grants": "",
        "phase": "full",
        "base_stream": None,
    }
    h.update(over)
    return h


def jl(*recs: dict[str, Any]) -> bytes:
    return b"".join(dump(r) + b"\n" for r in recs)


def summary_of(records: Iterable[tuple[int, bytes]]) -> dict[str, int]:
    """The SUMMARY an honest sender writes after these records."""
    entries = files = data = colls = lines = 0
    text = b""
    for rtype, body in records:
        if rtype == M.FILES:
            batch = json.loads(body)
            entries += len(batch)
            files += sum(1 for e in batch if isinstance(e, dict) and e.get("t") != "d")
        elif rtype == M.DATA:
            data += len(body)
        elif rtype == M.COLLECTION:
            text += body
    for line in text.split(b"\n"):
        if line.strip():
            lines += 1
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a hostile line: counted as a line, nothing more
            colls += isinstance(rec, dict) and rec.get("t") == "collection"
    return {
        "entries": entries,
        "files": files,
        "data_bytes": data,
        "collections": colls,
        "records": lines,
    }


def records(
    h: dict[str, Any] | bytes,
    entries: list[dict[str, Any]],
    data: bytes = b"",
    collections: bytes = b"",
    *,
    summary: Any = True,
    batch: int = M.FILES_PER_RECORD,
) -> list[tuple[int, bytes]]:
    """A payload as an honest writer cuts it: FILES of at most ``batch`` entries and
    1 MiB each, DATA and COLLECTION cut at 1 MiB, then the SUMMARY (``True``: honest)."""
    out: list[tuple[int, bytes]] = [(M.HEAD, h if isinstance(h, bytes) else dump(h))]
    cur: list[dict[str, Any]] = []
    size = 2
    for e in entries:
        n = len(dump(e)) + 1
        if cur and (len(cur) >= batch or size + n > M.MAX_JSON_RECORD):
            out.append((M.FILES, dump(cur)))
            cur, size = [], 2
        cur.append(e)
        size += n
    if cur or not entries:
        out.append((M.FILES, dump(cur)))
    for start in range(0, len(data), H.RECORD_MAX):
        out.append((M.DATA, data[start : start + H.RECORD_MAX]))
    for start in range(0, len(collections), H.RECORD_MAX):
        out.append((M.COLLECTION, collections[start : start + H.RECORD_MAX]))
    if summary is True:
        out.append((M.SUMMARY, dump(summary_of(out))))
    elif summary is not None:
        out.append((M.SUMMARY, summary if isinstance(summary, bytes) else dump(summary)))
    return out


# ---- the stream layer -----------------------------------------------------------------------
@dataclass
class Forge:
    """A stream to ``pub`` record by record; each record may be anything."""

    pub: PublicKey
    meta: dict[str, Any] = field(default_factory=lambda: {"kind": "lnk-move", "phase": "full"})
    wire: list[bytes] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    total: int = 0

    def __post_init__(self) -> None:
        self.key = os.urandom(32)
        self.header = H.build_header(
            self.pub.raw, self.pub.hpke_key, H.canonical_meta(self.meta), os.urandom(16), self.key
        )
        self.keys = R.Keys(self.key, self.header)

    @property
    def index(self) -> int:
        return len(self.wire)

    def add(self, rtype: int, body: bytes, *, zstd: bool = False) -> Forge:
        """An honest record (stored, or zstd-compressed when asked)."""
        payload, codec = body, R.CODEC_RAW
        if zstd:
            payload = zstandard.ZstdCompressor(write_content_size=True).compress(body)
            codec = R.CODEC_ZSTD
        return self.add_plain(bytes((rtype, codec)) + payload, rtype, body)

    def add_plain(self, pt: bytes, rtype: int | None = None, body: bytes | None = None) -> Forge:
        """A record whose plaintext (rtype ‖ codec ‖ payload) is given as-is; the final
        record counts it as ``rtype``/``body`` if given, else as what ``pt`` says raw."""
        rt = pt[0] if rtype is None else rtype
        b = pt[2:] if body is None else body
        self.wire.append(R.seal_raw(self.keys, self.index, pt))
        self.hashes.append(hashlib.sha256(bytes((rt,)) + b).digest())
        self.total += len(b)
        return self

    def add_all(self, recs: Iterable[tuple[int, bytes]]) -> Forge:
        for rtype, body in recs:
            self.add(rtype, body)
        return self

    def final(
        self, n: int | None = None, total: int | None = None, root: bytes | None = None
    ) -> bytes:
        body = R.final_body(
            self.index if n is None else n,
            self.total if total is None else total,
            hashlib.sha256(b"".join(self.hashes)).digest() if root is None else root,
        )
        pt = bytes((R.RTYPE_FINAL, R.CODEC_RAW)) + body
        return self.bytes() + R.seal_raw(self.keys, self.index, pt, final=True)

    def bytes(self) -> bytes:
        return self.header.raw + b"".join(self.wire)


def stream(pub: PublicKey, recs: Iterable[tuple[int, bytes]], **kw: Any) -> bytes:
    return Forge(pub, **kw).add_all(recs).final()


# ---- a destination and the real command line --------------------------------------------------
def lnk(
    home: Path, *args: str, stdin: bytes | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LNK_")}
    env["HOME"] = str(home)
    src = home.parent / "stream.bin"
    if stdin is not None:
        src.write_bytes(stdin)
    with open(src if stdin is not None else os.devnull, "rb") as fin:
        return subprocess.run(
            [sys.executable, "-m", "lnk", *args],
            stdin=fin,
            capture_output=True,
            env=env,
            timeout=timeout,
            check=False,
        )


def tree(root: Path, skip: tuple[str, ...] = (".lnk/receivers",)) -> dict[str, tuple[Any, ...]]:
    """Everything under ``root`` (kind, mode, content or link target), never following a
    link, iteratively (a tree of any depth)."""
    out: dict[str, tuple[Any, ...]] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as it:
            for e in it:
                r = f"{rel}/{e.name}" if rel else e.name
                if r in skip:
                    continue
                st = e.stat(follow_symlinks=False)
                mode = stat.S_IMODE(st.st_mode)
                if stat.S_ISLNK(st.st_mode):
                    out[r] = ("l", os.readlink(e.path))
                elif stat.S_ISDIR(st.st_mode):
                    out[r] = ("d", mode)
                    stack.append(r)
                elif stat.S_ISREG(st.st_mode):
                    out[r] = ("f", mode, st.st_mtime_ns, sha(Path(e.path).read_bytes()))
                else:
                    out[r] = ("x", stat.S_IFMT(st.st_mode), mode)
    return out


@dataclass
class Dest:
    """A HOME with (or without) the agent ``work``, and a receiver prepared by the CLI."""

    home: Path
    agent_id: str
    rid: str
    pub: PublicKey
    before: dict[str, tuple[Any, ...]]

    @classmethod
    def make(cls, home: Path, agent_id: str, *, for_agent: bool = True) -> Dest:
        args = ["agent", "state-receive", "--prepare", "--json"]
        if for_agent:
            args += ["--agent-id", agent_id]
        p = lnk(home, *args)
        assert p.returncode == 0, p.stderr.decode()
        info = json.loads(p.stdout)
        return cls(
            home, agent_id, info["receiver"], parse_public_key(info["public_key"]), tree(home)
        )

    def head(self, **over: Any) -> dict[str, Any]:
        return head(self.agent_id, **over)

    def stream(self, recs: Iterable[tuple[int, bytes]]) -> bytes:
        return stream(self.pub, recs)

    def forge(self) -> Forge:
        return Forge(self.pub)

    def receive(self, data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
        return lnk(self.home, "agent", "state-receive", "--receiver", self.rid, *args, stdin=data)

    def refuse(self, data: bytes, code: int, match: str) -> str:
        """Receive ``data``; it must be refused with one error line matching ``match``
        (a regular expression), exit ``code``, and change nothing here."""
        import re

        p = self.receive(data)
        err = p.stderr.decode("utf-8", "replace")
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert "Traceback" not in err, err
        assert lines and lines[0].startswith("lnk: error: "), err
        assert all(ln.startswith("lnk: hint: ") for ln in lines[1:]), err
        assert len(lines) <= 2, err
        assert re.search(match, lines[0]), f"{match!r} not in {lines[0]!r}"
        assert p.returncode == code, f"exit {p.returncode}, not {code}: {err}"
        assert tree(self.home) == self.before, "the destination changed"
        return lines[0]

    def accept(self, data: bytes) -> str:
        p = self.receive(data)
        err = p.stderr.decode("utf-8", "replace")
        assert p.returncode == 0, err
        assert "Traceback" not in err, err
        return err

    @property
    def agent_root(self) -> Path:
        return self.home / "Link" / "Agents" / "work"


def chain(depth: int, name: str = "a", top: str = "Home") -> Iterator[dict[str, Any]]:
    """The folder entries of a path ``depth`` folders deep under ``top``."""
    p = top
    for _ in range(depth):
        p += "/" + name
        yield dentry(p)
