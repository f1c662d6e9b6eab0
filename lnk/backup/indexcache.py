"""A repository's blob index kept on this machine between backups.

Every backup needs to know which blobs the repository holds; fetching, opening and
parsing every pack's index again costs about 2.8 us a blob (0.3 s at 100,000 files,
most of an unchanged backup's own work).  The index a backup built is kept in one
file beside the agent's other caches, with the packs whose indexes it holds.  The
next backup lists the repository's indexes (one listing, which it made anyway) and:

* holds the same packs: the file is the index, read into its arrays whole;
* holds more (the last backup's own packs): only their indexes are fetched, and
  merged in;
* holds fewer (a prune removed packs, a verify found one damaged): the index is
  built from every index again.

A pack's index never changes under its name (packs get random names, and a repack
writes new ones), so the listing names exactly what the file holds.  The file ends
with the SHA-256 of all before it: one damaged on disk is built again, never
believed.  Losing it only makes the next backup fetch every index.

Layout: ``MAGIC | u32 header length | header JSON | records | heads | fan-out |
sha256``, the header naming the repository, the byte order, the record count, the
packs loaded, and the pack and kind names the records number.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import sys
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

from lnk.backup.blobindex import FANOUT, WIDTH, BlobIndex, IndexBuilder, IndexParts
from lnk.backup.repository import Repository, add_index_doc

MAGIC = b"lnk-bix1"
HEADER_MAX = 64 << 20


KEEP_AFTER_MAX = 1 << 18
"""The most blobs a backup keeps its index of as it ends (made one segment from the
index it loaded and its own blobs, which holds them twice meanwhile: 14 MiB at most);
a bigger repository's next backup fetches that backup's pack indexes instead."""


def load_index(repo: Repository, path: Path) -> BlobIndex:
    """``repo.load_index(skip_damaged=True, missing_ok=True)`` through the index kept at
    ``path`` by the last run: only the indexes of packs added since are fetched, and
    the index is kept again when it changed."""
    return load_kept(repo, path).index


def load_kept(repo: Repository, path: Path) -> Kept:
    """:func:`load_index`, with the packs whose indexes it holds."""
    damaged = repo.damaged_packs()
    live = {n for n in repo.index_names() if n not in damaged}
    kept = load(path, repo.id)
    if kept is not None and not kept.loaded <= live:
        kept = None  # a pack it holds is gone or damaged: built from every index again
    if kept is not None and kept.loaded == live:
        return kept
    loaded = set(kept.loaded) if kept is not None else set()
    found = IndexBuilder(onto=kept.index if kept is not None else None)
    for pack, doc in repo.iter_indexes(sorted(live - loaded), missing_ok=True):
        add_index_doc(found, pack, doc, False)
        loaded.add(pack)
    index = found.build() if kept is None else kept.index.merged(found.build())
    save(path, repo.id, index, frozenset(loaded))
    return Kept(index, frozenset(loaded))


def keep_after(path: Path, repo_id: str, loaded: Kept, added: set[str]) -> None:
    """As a backup ends: keep its index (``loaded.index``, the blobs of the packs
    ``loaded.loaded``, with the blobs this run stored in the packs ``added`` set into
    it), so the next backup fetches none of those packs' indexes.  Not kept past
    :data:`KEEP_AFTER_MAX` blobs, nor when this run added no pack."""
    if not added:
        return
    whole = loaded.index.whole(KEEP_AFTER_MAX)
    if whole is not None:
        save(path, repo_id, whole, loaded.loaded | added)


def kept_path(folder: Path, repo: Repository) -> Path:
    """Where ``folder`` (an agent's runtime folder) keeps ``repo``'s index: named by the
    repository's ID in its canonical hex, whatever text the bucket's config gave."""
    return folder / f"backup-index-{repo.id_bytes.hex()}"


@dataclass(frozen=True, slots=True)
class Kept:
    """A kept index and the packs whose indexes it holds."""

    index: BlobIndex
    loaded: frozenset[str]


def load(path: Path, repo_id: str) -> Kept | None:
    """The index kept at ``path`` for repository ``repo_id``, or None (none, another
    repository's, another machine's byte order, or damaged)."""
    try:
        with path.open("rb") as f:
            return _read(f, repo_id)
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None


def _read(f: io.BufferedReader, repo_id: str) -> Kept | None:
    h = hashlib.sha256()
    start = f.read(len(MAGIC) + 4)
    if len(start) != len(MAGIC) + 4 or not start.startswith(MAGIC):
        return None
    (n,) = struct.unpack(">I", start[len(MAGIC) :])
    if n > HEADER_MAX:
        return None
    raw = f.read(n)
    h.update(start)
    h.update(raw)
    head = json.loads(raw)
    if head["repo"] != repo_id or head["byteorder"] != sys.byteorder:
        return None
    count = int(head["count"])
    size = len(start) + n + count * (WIDTH + 8) + 8 * (FANOUT + 1) + h.digest_size
    if count < 0 or os.fstat(f.fileno()).st_size != size:
        return None  # before anything is allocated for it
    records = bytearray(count * WIDTH)
    if f.readinto(records) != len(records):
        return None
    heads, fanout = array("Q"), array("Q")
    heads.fromfile(f, count)  # EOFError if short
    fanout.fromfile(f, FANOUT + 1)
    for part in (records, heads, fanout):
        h.update(memoryview(part).cast("B"))
    if f.read(33) != h.digest():  # exactly the digest, then the end
        return None
    parts = IndexParts(records, fanout, heads, _strings(head["packs"]), _strings(head["kinds"]))
    return Kept(BlobIndex.from_parts(parts), frozenset(_strings(head["loaded"])))


def _strings(v: object) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError("not a list of names")
    return v


def save(path: Path, repo_id: str, index: BlobIndex, loaded: frozenset[str]) -> None:
    """Keep ``index`` (built from the indexes of the packs ``loaded``) at ``path``,
    whole or not at all; a folder that cannot be written leaves nothing kept."""
    parts = index.parts()
    head = json.dumps(
        {
            "repo": repo_id,
            "byteorder": sys.byteorder,
            "count": len(parts.heads),
            "loaded": sorted(loaded),
            "packs": parts.packs,
            "kinds": parts.kinds,
        }
    ).encode()
    h = hashlib.sha256()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".bix-", dir=path.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as f:
            for part in (MAGIC + struct.pack(">I", len(head)), head):
                h.update(part)
                f.write(part)
            for arr in (parts.records, parts.heads, parts.fanout):
                view = memoryview(arr).cast("B")
                h.update(view)
                f.write(view)
            f.write(h.digest())
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
