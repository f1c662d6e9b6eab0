"""What a receiver already holds: a sorted run of 32-byte SHA-256 digests.

The receiver hands it to the sender, which then sends no bytes of a file
whose content is in it.  Kept as one bytes object and searched by bisection,
so a million digests cost 32 MB, not a Python set's 150.
"""

from __future__ import annotations

import json
import re
import struct
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from lnk.errors import InvalidInput

DIGEST = 32
MAGIC = b"LNKINV1\n"
MAGIC2 = b"LNKINV2\n"  # then u32 length, a JSON object {"logs", "dirs", "at"}, the digests
MAX_LOGS_JSON = 64 << 20
_DIGEST_HEX = re.compile(r"^[0-9a-f]{64}$")


def held_whole(
    mine: dict[str, str], theirs: dict[str, str], sizes: dict[str, int], most: int
) -> dict[str, str]:
    """The folders to name as held whole: held here with the digest the sender has for
    them too (``theirs`` may give only the first hex digits of each), with at most
    ``most`` files and folders inside (``sizes``), and none inside another named one.
    A bigger folder is not named (a sender gives up keeping a folder whole past its
    limit), its subfolders are."""
    same = {p: d for p, d in mine.items() if d.startswith(theirs.get(p) or "-")}
    named: dict[str, str] = {}
    for p in sorted(same, key=lambda p: (p.count("/"), p)):  # outer folders first
        if sizes.get(p, 0) <= most and not under_any(p, named):
            named[p] = same[p]
    return named


def sizes_of(paths: Iterable[str]) -> dict[str, int]:
    """For each folder, how many of ``paths`` lie inside it at any depth.

    Counted by parent first, then each parent's count added to its ancestors: one
    split a path and one walk up a folder (a file's ancestors are its parent and
    the parent's), not a walk up from every file."""
    direct: dict[str, int] = {}
    for rel in paths:
        parent = _parent(rel)
        if parent:
            direct[parent] = direct.get(parent, 0) + 1
    n: dict[str, int] = {}
    for folder, k in direct.items():
        n[folder] = n.get(folder, 0) + k
        for a in ancestors(folder):
            n[a] = n.get(a, 0) + k
    return n


def _parent(rel: str) -> str:
    """The first of ``ancestors(rel)``, or "" when it has none."""
    i = rel.rfind("/")
    return rel[:i] if i > 0 else ""


def ancestors(rel: str) -> Iterable[str]:
    """``a/b/c`` -> ``a/b``, ``a``."""
    i = rel.rfind("/")
    while i > 0:
        rel = rel[:i]
        yield rel
        i = rel.rfind("/")


def under_any(rel: str, folders: dict[str, str]) -> bool:
    """Whether the path lies inside one of ``folders``."""
    return any(a in folders for a in ancestors(rel))


def _meta_length(head: bytes) -> int:
    """The length of a version 2 inventory's JSON, from its first 12 bytes."""
    if len(head) < len(MAGIC2) + 4:
        raise InvalidInput("the inventory ends in its header", hint="make a new one")
    (n,) = struct.unpack(">I", head[len(MAGIC2) : len(MAGIC2) + 4])
    if n > MAX_LOGS_JSON:
        raise InvalidInput("the inventory's log list is too large", hint="make a new one")
    return int(n)


def _meta(raw: bytes) -> tuple[dict[str, list[Any]], dict[str, str], int]:
    """A version 2 inventory's JSON, checked: (logs, dirs, at)."""
    try:
        meta = json.loads(raw)
        logs = dict(meta.get("logs", {}))
        dirs = dict(meta.get("dirs", {}))
        at = meta.get("at", 0)
    except (ValueError, AttributeError, TypeError, RecursionError) as e:
        raise InvalidInput(
            f"the inventory's log list is damaged ({e})", hint="make a new one"
        ) from e
    for k, v in dirs.items():
        if not isinstance(k, str) or not isinstance(v, str) or not _DIGEST_HEX.match(v):
            raise InvalidInput("the inventory's folder digests are damaged", hint="make a new one")
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < 1 << 63:
        raise InvalidInput(
            "the inventory's time of the sender's digests is not a time", hint="make a new one"
        )
    return logs, dirs, at


class Inventory:
    """Content digests, and each log's (last number, SHA-256 of its last event).

    With the logs, a sender sends a log only from where the receiver's copy
    ends, when both agree on that last event.  With the folders' digests (path ->
    digest, docs/stream-format.md "Folder digests"), a sender sends a folder the
    receiver holds whole at the same path as one entry.  With ``at`` (the sender's
    file-system clock when it took the digests the folders were named against), what
    is inside a named folder that changed since is still known held where it has not
    changed since (7.7, lnk/payload/unchanged.py).
    """

    def __init__(
        self,
        blob: bytes = b"",
        logs: dict[str, list[Any]] | None = None,
        dirs: dict[str, str] | None = None,
    ) -> None:
        if len(blob) % DIGEST:
            raise InvalidInput(
                "an inventory is a whole number of 32-byte digests",
                hint="make a new one with lnk agent state-receive --inventory",
            )
        self.blob = blob
        self.logs = logs or {}
        self.dirs = dirs or {}
        self.at = 0
        self._starts: array[int] | None = None

    def log_since(self, key: str, last_here: int, digest_at: Any) -> int:
        """The number to send a log from: the receiver's last, if it agrees with ours."""
        held = self.logs.get(key)
        if not (isinstance(held, list) and len(held) == 2 and isinstance(held[0], int)):
            return 0
        n, digest = held
        if not 0 < n <= last_here:
            return 0
        return n if digest_at(n) == digest else 0

    def __len__(self) -> int:
        return len(self.blob) // DIGEST

    def __contains__(self, digest: bytes | str) -> bool:
        d = bytes.fromhex(digest) if isinstance(digest, str) else digest
        if len(d) != DIGEST:
            return False
        starts = self._starts if self._starts is not None else self._index()
        p = d[0] << 8 | d[1]
        lo, hi = starts[p], starts[p + 1]
        if lo == hi:  # none begins so (every digest of a first send: nothing is held)
            return False
        blob = self.blob
        # the digests beginning with these two bytes: about len/65536 of them
        return any(blob.startswith(d, i * DIGEST) for i in range(lo, hi))

    def _index(self) -> array[int]:
        """Where the digests of each first two bytes begin in the sorted blob (256 KiB,
        made at the first lookup: a send asks once a file)."""
        counts = [0] * 65536
        blob = self.blob
        for a, b in zip(blob[0::DIGEST], blob[1::DIGEST], strict=True):
            counts[a << 8 | b] += 1
        starts = array("I", bytes(4 * 65537))
        at = 0
        for p, n in enumerate(counts):
            starts[p] = at
            at += n
        starts[65536] = at
        self._starts = starts
        return starts

    @classmethod
    def of(cls, digests: Iterable[bytes | str]) -> Inventory:
        items = sorted({bytes.fromhex(d) if isinstance(d, str) else bytes(d) for d in digests})
        return cls(b"".join(items))

    def to_bytes(self) -> bytes:
        if not self.logs and not self.dirs and not self.at:
            return MAGIC + self.blob
        doc: dict[str, Any] = {"logs": self.logs, "dirs": self.dirs}
        if self.at:
            doc["at"] = self.at
        meta = json.dumps(doc, separators=(",", ":")).encode()
        return MAGIC2 + struct.pack(">I", len(meta)) + meta + self.blob

    @classmethod
    def from_bytes(cls, data: bytes) -> Inventory:
        logs: dict[str, list[Any]] = {}
        dirs: dict[str, str] = {}
        at = 0
        if data.startswith(MAGIC2):
            n = _meta_length(data[: len(MAGIC2) + 4])
            start = len(MAGIC2) + 4
            logs, dirs, at = _meta(data[start : start + n])
            blob = data[start + n :]
        elif data.startswith(MAGIC):
            blob = data[len(MAGIC) :]
        else:
            raise InvalidInput(
                "that is not an lnk inventory",
                hint="make one with lnk agent state-receive --inventory --receiver R",
            )
        inv = cls(blob, logs, dirs)
        inv.at = at
        for i in range(1, len(inv)):
            if blob[(i - 1) * DIGEST : i * DIGEST] >= blob[i * DIGEST : (i + 1) * DIGEST]:
                raise InvalidInput("the inventory is not sorted", hint="make a new one")
        return inv

    @staticmethod
    def at_of(f: IO[bytes]) -> int:
        """The ``at`` of the inventory in ``f``, from its header alone (its digests not
        read): 0 for one that says none.  InvalidInput as :meth:`from_bytes`."""
        head = f.read(len(MAGIC2) + 4)
        if not head.startswith(MAGIC2):
            if head.startswith(MAGIC):
                return 0
            raise InvalidInput("that is not an lnk inventory", hint="make a new one")
        return _meta(f.read(_meta_length(head)))[2]

    @classmethod
    def load(cls, path: Path) -> Inventory:
        return cls.from_bytes(path.read_bytes())
