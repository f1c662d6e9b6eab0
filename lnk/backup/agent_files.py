"""An agent's files and collections into one snapshot: one walk, and only what changed
is read.

One walk (:func:`lnk.payload.walk.walk_agent`, the stream's) gives every entry and,
at each folder's end, its digest.  A folder whose digest is the one the last backup
to this repository saw, and whose lines that backup kept (``DirCache``), is written
from those lines: none of its files is opened, or even looked up one by one
(every folder's digest is known before the walk, ``lnk/payload/digests.py``, and the
walk does not go into those).  Elsewhere each file is stored by
:class:`lnk.backup.file_reads.FileSaver`: by its known chunks when its stat is the one
the last backup read, else read once.

Modes are written as a receiver makes them (a file ``| 0o600``, a folder ``| 0o700``,
no setuid, setgid or sticky bit), as the folder digest covers them: a restore goes
through the stream's receiver, which does the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from lnk.agents.registry import Agent
from lnk.agents.stores import open_agent_store
from lnk.backup.file_reads import FileSaver
from lnk.backup.filecache import ChunkCache, DirCache, DirRow
from lnk.backup.read_ahead import ReadAhead
from lnk.backup.small_reads import SmallRead
from lnk.collections.ids import FORMAT_VERSION
from lnk.payload import manifest as M
from lnk.payload.agent_records import export_lines
from lnk.payload.digests import keeper
from lnk.payload.hashcache import RACY_NS, HashCache
from lnk.payload.listings import FolderPrint
from lnk.payload.walk import (
    DIGEST_TAG,
    WalkedFile,
    WalkStats,
    dir_line,
    file_line,
    link_line,
    walk_agent,
)

SPOOL = 4 << 20
WHOLE_FILES = 20_000
"""The most files a folder written from the last backup's lines may hold: its lines
are held until written, so a bigger one is walked into (its subfolders may still come
whole) and memory stays bounded whatever the agent's size."""


class _Dir:
    """A folder backed up entry by entry: the row the next backup may write it from."""

    __slots__ = (
        "bytes",
        "entries",
        "files",
        "fp",
        "h",
        "ids",
        "items",
        "mode",
        "ok",
        "own",
        "rel",
        "slot",
    )

    def __init__(self, rel: str, mode: int, line: bytes, slot: int, fresh: int) -> None:
        self.rel, self.mode = rel, mode
        # its digest as this backup saw it, for a folder the walk could not vouch for
        # (the first backup: no SHA-256 known when it walked); own: still vouched for
        self.h = hashlib.sha256(DIGEST_TAG)
        self.own = True
        self.items: list[bytes] = [b"E" + line]
        self.ids = bytearray()
        self.ok = True
        self.entries, self.files, self.bytes = 1, 0, 0
        self.slot = slot  # its place in its parent's items (-1: a root)
        # its fingerprint, so the next backup finds its digest with a stat of each entry
        self.fp = FolderPrint(fresh)


class _Row:
    """A folder row being read: its items, and how each of its lines must begin (its
    own entry, or an entry or tree line below it: never a sibling's, never elsewhere)."""

    __slots__ = ("entry", "items", "rel", "tree")

    def __init__(self, rel: str, items: Iterator[bytes]) -> None:
        self.rel, self.items = rel, items
        self.entry = _within(b'E{"p":', M.dump(rel))
        self.tree = _within(b'T{"t":"f","path":', json.dumps(f"agent/{rel}").encode())


def _within(head: bytes, quoted: bytes) -> tuple[bytes, bytes]:
    """The starts a line of the folder ``quoted`` (a JSON string) may have: the folder
    itself (its closing quote) or a path below it (a slash)."""
    return head + quoted, head + quoted[:-1] + b"/"


def _one_name(name: object) -> bool:
    """A single path component: never empty, ``.``, ``..`` or holding a slash or NUL."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\0" not in name
    )


class _Segment:
    """A folder written from the last backup's lines: entry lines, tree lines, blobs."""

    __slots__ = ("bytes", "dirs", "entries", "files", "ids", "lines", "packs", "tree")

    def __init__(self) -> None:
        self.dirs: list[str] = []  # the folders it holds, itself first
        self.lines: list[bytes] = []
        self.tree: list[bytes] = []
        self.ids = bytearray()  # the blobs its own rows name (checked once, at accept)
        self.packs: set[str] = set()  # the packs holding every blob it names
        self.entries = self.files = self.bytes = 0


class FilesBackup:
    """One backup's pass over the agent's files (see the module's docstring)."""

    def __init__(
        self,
        w: Any,
        agent: Agent,
        caches: tuple[HashCache, ChunkCache],
        entries: IO[bytes],
        snap_dir: str,
        layout: int,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.w, self.agent, self.out = w, agent, entries
        self.cache, self.chunks = caches
        self.dirs = DirCache(self.chunks)
        self.saver = FileSaver(w, self.cache, self.chunks, snap_dir)
        self.snap_dir, self.layout, self.progress = snap_dir, layout, progress
        self.entries = self.files = self.bytes = 0
        self.ready: dict[str, _Segment] = {}  # folders accepted whole, not yet written
        self.seen: set[str] = set()  # every folder of this backup (rows kept)
        self.stack: list[_Dir] = []
        self.fresh = 0  # the walk's start less RACY_NS (listings.FolderPrint)

    # ---- the walk -------------------------------------------------------------
    def run(self) -> None:
        by_folder = self.layout == 2  # the older layout (tests only) goes file by file
        self.fresh = time.time_ns() - RACY_NS
        items = walk_agent(
            self.agent.folders.root,
            self.cache,
            WalkStats(),
            Path(self.snap_dir),
            hash_files=False,
            links=True,
            sqlite=False,
            ends=by_folder,
            keep=self._keeper() if by_folder else None,
        )
        if by_folder:  # small files read by the second process once it runs
            ahead = ReadAhead(lambda: self.w.reader, self._readable, self._item)
            for f in items:
                ahead.push(f)
            ahead.finish()
            self.dirs.keep_only(self.seen)
        else:
            for f in items:
                self._item(f, None)

    def _skipped(self, f: WalkedFile) -> bool:
        """A layout-1 repository holds the agent's Home only."""
        return self.layout == 1 and not (f.rel == "Home" or f.rel.startswith("Home/"))

    def _readable(self, f: WalkedFile) -> bytes | None:
        """Where the second process may read ``f``: only a file :meth:`_item` stores (the
        saver keeps what the chunk cache said of it until then)."""
        return None if f.kind != "f" or f.kept or self._skipped(f) else self.saver.readable(f)

    def _item(self, f: WalkedFile, read: SmallRead | None) -> None:
        """One item of the walk, in walk order; ``read``: the file as read ahead."""
        if f.kind == "e":
            self._end(f)
        elif self._skipped(f):
            return
        elif f.kept:
            self._whole(f)
        else:
            self._entry(f, read)

    def _line(self, entry: M.FileEntry) -> bytes:
        line = M.dump(entry.to_json()) + b"\n"
        self.out.write(line)
        self.entries += 1
        return line

    def _entry(self, f: WalkedFile, read: SmallRead | None = None) -> None:
        top = self.stack[-1] if self.stack else None
        if f.kind == "d":
            line = self._line(M.FileEntry(f.rel, "d", M.dir_mode(f.mode)))
            self.seen.add(f.rel)
            slot = -1
            if top is not None:
                slot = len(top.items)
                top.items.append(b"")  # the subfolder's place, named at its end
            if self.layout == 2:
                self.stack.append(_Dir(f.rel, f.mode, line, slot, self.fresh))
            return
        if f.kind == "l":  # a symbolic link: its target text, never followed
            line = self._line(M.FileEntry(f.rel, "l", 0o777, target=f.target))
            if top is not None:
                name = f.rel.rpartition("/")[2]
                top.h.update(_utf8(link_line(name, f.target)))
                self._printed(top, name, f.st)
                top.items.append(b"E" + line)
                top.entries += 1
            return
        got = self.saver.file(f) if read is None else self.saver.taken(f, read)
        if got is None:  # gone, or no longer a regular file: not in this backup
            if top is not None:
                top.ok = False
            return
        sha, size, tree, ids = got
        data = bool(tree)  # a hard link after its group's first carries no bytes
        carried = size if data else 0
        if self.progress and carried:
            self.progress(carried)
        self.files += 1
        self.bytes += carried
        line = self._line(
            M.FileEntry(f.rel, "f", M.file_mode(f.mode), size, sha, f.group, data, f.mtime_ns)
        )
        if top is not None:
            if f.sha256 and sha != f.sha256:
                top.ok = False  # changed since the walk saw it: its digest is not this
            name = f.rel.rpartition("/")[2]
            self._printed(top, name, f.st)
            if self.saver.vouched and f.group is None:
                top.h.update(_utf8(file_line(name, f.mode, size, f.mtime_ns, sha)))
            else:
                top.own = False
            top.items.append(b"E" + line)
            if tree:
                top.items.append(b"T" + tree)
                top.ids += ids
            top.entries += 1
            top.files += 1
            top.bytes += carried

    def _end(self, f: WalkedFile) -> None:
        d = self.stack.pop()
        up = self.stack[-1] if self.stack else None
        digest = f.sha256 or (d.h.hexdigest() if d.own else "")
        if not d.ok:
            digest = ""
        d.fp.remember(self.cache, d.rel, digest, f.skipped)
        if up is not None:
            name = d.rel.rpartition("/")[2]
            up.fp.subfolder(name, d.mode, digest, d.fp.files)
            if digest:
                up.items[d.slot] = b"S" + M.dump([name, digest]) + b"\n"
                up.h.update(_utf8(dir_line(name, d.mode, digest)))
            else:
                up.ok = up.own = False
        if digest:
            body = b"".join(d.items)
            self.dirs.store(d.rel, DirRow(digest, body, bytes(d.ids), d.entries, d.files, d.bytes))

    # ---- folders unchanged since the last backup -----------------------------------
    def _keeper(self) -> Callable[[str], str] | None:
        """Which folders are written from the last backup's lines: every folder's digest
        now first (lnk/payload/digests.py: a stat of each entry where the hash cache
        remembers the folder), then the walk goes into none of those."""

        def accept(rel: str, digest: str, files: int) -> bool:
            return files <= WHOLE_FILES and self._accept(rel, digest)

        return keeper(self.dirs.digests(), self.agent.folders.root, self.cache, accept)

    def _accept(self, rel: str, digest: str) -> bool:
        """Whether the folder ``rel`` with ``digest`` can be written from the last
        backup's lines (each subfolder's row there, with the digest its parent named,
        and every blob still in the repository); if so, its lines are made ready."""
        seg = _Segment()
        inner: list[str] = []  # subfolders accepted on their own already: spliced in
        todo: list[_Row] = []  # the rows being read, innermost last
        if not self._open_row(seg, todo, rel, digest):
            return False
        while todo:
            at = todo[-1]
            item = next(at.items, None)
            if item is None:
                todo.pop()
                continue
            tag = item[:1]
            # a row is the cache's word, read back from disk: every line it gives must be
            # of its own folder, or the folder goes file by file
            if tag == b"E" and item.startswith(at.entry):
                seg.lines.append(item[1:] + b"\n")
            elif tag == b"T" and item.startswith(at.tree):
                seg.tree.append(item[1:] + b"\n")
            elif tag == b"S":
                try:
                    name, sub_digest = json.loads(item[1:])
                except (ValueError, TypeError):
                    return False
                if not _one_name(name) or not isinstance(sub_digest, str):
                    return False
                sub = f"{at.rel}/{name}"
                done = self.ready.get(sub)
                if done is not None:
                    inner.append(sub)
                    seg.lines.extend(done.lines)
                    seg.tree.extend(done.tree)
                elif not self._open_row(seg, todo, sub, sub_digest):
                    return False
            else:
                return False  # unknown, or a line of another folder
        packs = self.w.packs_of(bytes(seg.ids))
        if packs is None:
            return False  # a prune took some: its files are read again
        seg.packs = packs
        for sub in inner:
            done = self.ready.pop(sub)
            seg.packs |= done.packs
            seg.dirs.extend(done.dirs)
            seg.entries += done.entries
            seg.files += done.files
            seg.bytes += done.bytes
        self.ready[rel] = seg
        return True

    def _open_row(self, seg: _Segment, todo: list[_Row], rel: str, digest: str) -> bool:
        row = self.dirs.row(rel)
        if row is None or row.digest != digest:
            return False
        todo.append(_Row(rel, iter(row.body.split(b"\n")[:-1])))
        seg.dirs.append(rel)
        seg.ids += row.ids
        seg.entries += row.entries
        seg.files += row.files
        seg.bytes += row.bytes
        return True

    def _whole(self, f: WalkedFile) -> None:
        seg = self.ready.pop(f.rel)
        self.out.write(b"".join(seg.lines))
        self.w.add_lines(b"".join(seg.tree), seg.packs, seg.files, seg.bytes)
        self.entries += seg.entries
        self.files += seg.files
        self.bytes += seg.bytes
        self.seen.update(seg.dirs)  # its folders' rows stay
        if self.progress:
            self.progress(seg.bytes)
        top = self.stack[-1] if self.stack else None
        if top is not None:
            name = f.rel.rpartition("/")[2]
            top.items.append(b"S" + M.dump([name, f.kept]) + b"\n")
            top.h.update(_utf8(dir_line(name, f.mode, f.kept)))
            top.fp.subfolder(name, f.mode, f.kept, seg.files)

    @staticmethod
    def _printed(top: _Dir, name: str, st: os.stat_result | None) -> None:
        """An entry into its folder's fingerprint, by the lstat the walk saw."""
        if st is None:
            top.fp.racy = True  # no stat to vouch by: the folder is not remembered
        else:
            top.fp.entry(name, st)


def add_collections(w: Any, agent: Agent, chunks: ChunkCache) -> tuple[int, int]:
    """Each collection's export as collections/<n>.jsonl; (collections, records).  One
    whose store watermark is unchanged since the last backup is not exported again."""
    s = agent.settings
    store = open_agent_store(agent.folders.chats, s.store, s.lapse_s)
    collections = records = 0
    try:
        for i, cid in enumerate(store.collections()):
            path = f"collections/{i:06d}.jsonl"
            key = f"{s.store}\0{cid.kind}\0{cid.name}"
            mark = f"{FORMAT_VERSION}:{store.watermark(cid)}"  # read before the export
            hit = chunks.collection(key, mark)
            if hit is not None and w.add_known(path, 0o600, hit[0], hit[2]):
                records += hit[1]
                collections += 1
                continue
            n = 0
            with tempfile.SpooledTemporaryFile(max_size=SPOOL) as f:
                for _rec, line in export_lines(store, cid):
                    f.write(line)
                    n += 1
                size = f.tell()
                f.seek(0)
                ids = w.add_file(path, 0o600, f)
            chunks.store_collection(key, mark, size, n, ids)
            records += n
            collections += 1
    finally:
        store.close()
    return collections, records


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")  # as the walk's digest encodes it
