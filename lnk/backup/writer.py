"""Writing one snapshot: chunk, dedupe, pack, seal, commit.

Chunking is fixed-size (the repository's ``chunk_size``, 1 MiB): an agent's
state is mostly small files and append-only logs (chats), which fixed chunks
dedupe as well as content-defined ones (only a log's last chunk changes), and
fixed chunks are simpler and cheaper.  Each chunk is named by HMAC-SHA256 under
the dedup key; a chunk the repository already holds is not uploaded again.

Commit order: packs (each followed by its own index object, so an interrupted
run leaves reusable data) -> the tree -> the snapshot object, the one commit.

This module holds the snapshot's side: its tree of file entries, the cutting
of lists, the in-progress marker and the commit.  How chunks become sealed
blobs in packs (named, sealed on a pool or in batches, uploaded while the next
pack fills) is ``packer.py``'s.  What was added is in the bucket once
:meth:`SnapshotWriter.commit` returns.  Names are random, nothing is
read-modified-written, so two runs at once never corrupt each other.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time as _time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from lnk.backup.blobindex import BlobIndex
from lnk.backup.locks import lock_doc
from lnk.backup.pack import pin_mmap_threshold
from lnk.backup.packer import Packer, Queued
from lnk.backup.repository import Repository
from lnk.backup.sealer import SealProcess
from lnk.errors import BackupError, InvalidInput

# json.dumps with any option builds an encoder per call: one, kept (a line per file)
_LINE = json.JSONEncoder(separators=(",", ":"))
LOCK_REFRESH = 600.0  # seconds between refreshes of the in-progress marker
INFLIGHT = 4  # big chunks of one file being named and sealed at once
LIST_MIN = 64 << 10  # a tree or file list is cut into pieces of at least this ...
LIST_MASK = 0x3FF  # ... then after a line whose CRC-32 has these bits zero (1 in 1024)


class SnapshotWriter:
    """One backup run.  Use as a context manager, or call :meth:`abort`."""

    def __init__(self, repo: Repository, index_kept: Path | None = None) -> None:
        """``index_kept``: where this machine keeps the repository's blob index between
        runs (:mod:`lnk.backup.indexcache`); None fetches every index."""
        self.repo = repo
        self.bucket = repo.bucket
        _ = repo.master  # a writer needs the writer secret
        pin_mmap_threshold()
        self.run_id = os.urandom(16)
        self.lock_key = f"locks/{self.run_id.hex()}"
        self._touch_lock()
        self._packs = Packer(repo, self.run_id, self._keep_lock, index_kept)
        self._tree = tempfile.SpooledTemporaryFile(max_size=4 * 1024 * 1024)  # noqa: SIM115
        self.files = 0
        self.bytes = 0
        self.committed: str | None = None
        self.last_line = b""  # the tree line of the last file or blob added

    @property
    def known(self) -> BlobIndex:
        """Every blob the repository holds (not only in damaged packs), and this run's."""
        return self._packs.known

    @property
    def uploaded_blobs(self) -> int:
        """Blobs this run put in packs (the others the repository held already)."""
        return self._packs.uploaded_blobs

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.committed is None:
            self.abort()

    # ---- adding -------------------------------------------------------------

    def add_file(self, path: str, mode: int, fileobj: IO[bytes]) -> list[str]:
        """Store a file read from ``fileobj`` (streamed, one chunk at a time)
        under the relative ``path`` with permission bits ``mode``; returns its
        chunk IDs (hex), for :meth:`add_known` in a later run.

        A small file's chunk is named here and sealed in the background while the
        next files are read (many small files share one pack, no round trip each);
        a big file waits for its own chunks' names only.  What was added is in the
        bucket once :meth:`commit` returns."""
        _check_path(path)
        items: list[bytes | Queued] = []
        size = 0
        big = 0
        while True:
            data = fileobj.read(self.repo.chunk_size)
            if not data:
                break
            while len(data) < self.repo.chunk_size:  # short reads from pipes
                more = fileobj.read(self.repo.chunk_size - len(data))
                if not more:
                    break
                data += more
            size += len(data)
            item = self._packs.enqueue("data", data)
            items.append(item)
            if isinstance(item, Queued):
                big += 1
                if big >= INFLIGHT:  # bound the file's own chunks in flight
                    self._packs.settle_until(item)
                    big = 0
        chunks = [self._packs.resolve(i).hex() for i in items]
        self._file_entry(path, mode, size, chunks)
        self._keep_lock()
        return chunks

    def add_list(self, path: str, mode: int, fileobj: IO[bytes]) -> list[str]:
        """:meth:`add_file` for a list of lines (a snapshot's file list): cut where
        the lines say (:func:`line_cuts`), so what did not change dedupes."""
        _check_path(path)
        chunks: list[str] = []
        size = 0
        for part in line_cuts(fileobj, self.repo.chunk_size):
            chunks.append(self._packs.add_chunk("data", part).hex())
            size += len(part)
        self._file_entry(path, mode, size, chunks)
        return chunks

    def add_bytes(self, path: str, mode: int, data: bytes) -> list[str]:
        """:meth:`add_file` for a file read whole already (a small one: no file object,
        no copy)."""
        _check_path(path)
        step = self.repo.chunk_size
        if len(data) <= step:
            items = [self._packs.enqueue("data", data)] if data else []
        else:
            items = [
                self._packs.enqueue("data", data[i : i + step]) for i in range(0, len(data), step)
            ]
        chunks = [self._packs.resolve(i).hex() for i in items]
        size = len(data)
        self._file_entry(path, mode, size, chunks)
        return chunks

    def add_sealed(
        self, path: str, mode: int, size: int, blob_id: bytes, sealed: bytes
    ) -> list[str]:
        """:meth:`add_bytes` for a small file the second process read, named and sealed
        already (``small_reads.py``); ``blob_id`` is b"" for an empty one."""
        _check_path(path)
        chunks = []
        if blob_id:
            self._packs.add_sealed("data", blob_id, sealed)
            chunks.append(blob_id.hex())
        self._file_entry(path, mode, size, chunks)
        self._keep_lock()
        return chunks

    @property
    def reader(self) -> SealProcess | None:
        """The process that reads small files for this run, once it runs."""
        return self._packs.reader

    def packs_of(self, ids: bytes) -> set[str] | None:
        """The packs holding the blobs ``ids`` (32-byte IDs, end to end); None when one
        of them is neither stored nor on its way in this run (whose own packs count
        anyway)."""
        packs, missing = self.known.packs_of(ids)
        if any(not self._packs.on_its_way(i) for i in missing):
            return None
        return packs

    def add_lines(self, lines: bytes, packs: set[str], files: int, size: int) -> None:
        """Tree lines this repository stored before, verbatim (a folder unchanged since the
        last backup), naming blobs in ``packs`` (:meth:`packs_of`), for ``files`` files of
        ``size`` bytes."""
        self._packs.referenced |= packs
        self._tree.write(lines)
        self.files += files
        self.bytes += size

    def add_known(self, path: str, mode: int, size: int, chunks: list[str]) -> bool:
        """Store a file whose chunks (from an earlier :meth:`add_file`) the repository
        holds, without reading it; False (nothing added) if any of them is gone."""
        _check_path(path)
        try:
            refs = [self.known.get(bytes.fromhex(c)) for c in chunks]
        except ValueError:
            return False
        ids = [bytes.fromhex(c) for c in chunks]
        if any(r is None and not self._packs.on_its_way(i) for r, i in zip(refs, ids, strict=True)):
            return False
        self._packs.referenced.update(r.pack for r in refs if r is not None)
        self._file_entry(path, mode, size, chunks)
        return True

    def add_blob(self, name: str, data: bytes) -> None:
        """Store a small piece of metadata under ``name`` (read back by name)."""
        if not name:
            raise InvalidInput("a blob needs a name")
        chunks = [
            self._packs.add_chunk("data", data[i : i + self.repo.chunk_size]).hex()
            for i in range(0, len(data), self.repo.chunk_size)
        ]
        self._entry({"t": "b", "name": name, "size": len(data), "chunks": chunks})

    def sync(self) -> None:
        """Wait until every full pack of what was added is in the bucket (the last,
        partly filled pack waits for more, or for :meth:`commit`)."""
        self._packs.drain()
        self._packs.wait_upload()

    def store_blob(self, kind: str, data: bytes) -> bytes:
        """Store one blob of ``kind`` outside any file (a repair re-storing what a
        damaged pack held); its ID.  :meth:`close_without_snapshot` keeps it."""
        return self._packs.add_chunk(kind, data)

    def close_without_snapshot(self) -> None:
        """Put every pack filled so far (each with its index) and end the run
        without a snapshot (a repair)."""
        self._packs.drain()
        self._packs.flush()
        self._packs.wait_upload()
        self.abort()

    def _file_entry(self, path: str, mode: int, size: int, chunks: list[str]) -> None:
        self._entry({"t": "f", "path": path, "mode": mode & 0o7777, "size": size, "chunks": chunks})
        self.files += 1
        self.bytes += size

    def _entry(self, doc: dict[str, Any]) -> None:
        self.last_line = _LINE.encode(doc).encode() + b"\n"
        self._tree.write(self.last_line)

    def _keep_lock(self) -> None:
        if _time.monotonic() - self._lock_time > LOCK_REFRESH:
            self._touch_lock()

    def _touch_lock(self) -> None:
        self.bucket.put(self.lock_key, json.dumps(lock_doc(self.run_id.hex())).encode())
        self._lock_time = _time.monotonic()

    # ---- committing ---------------------------------------------------------

    def commit(self, meta: dict[str, Any] | None = None, *, time: datetime | None = None) -> str:
        """Write what is left, then the snapshot object (the commit).

        ``meta`` is visible to every holder of the writer secret: keep secrets
        out of it.  ``time`` defaults to now (tests inject times)."""
        if self.committed is not None:
            raise BackupError("this snapshot was already committed")
        self._tree.seek(0)
        tree = [
            self._packs.add_chunk("tree", part).hex()
            for part in line_cuts(self._tree, self.repo.chunk_size)
        ]
        self._packs.drain()
        self._packs.flush()
        self._packs.wait_upload()
        self._packs.shutdown()
        present = {k.rsplit("/", 1)[1] for k, _ in self.bucket.list("data/")}
        missing = self._packs.referenced - present
        if missing:
            raise BackupError(
                f"{len(missing)} pack(s) this backup reuses were deleted while it ran "
                "(a prune at the same time?)",
                hint="run the backup again; nothing was committed",
            )
        when = time or datetime.now(UTC)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        snap_id = secrets.token_hex(16)
        doc = {
            "id": snap_id,
            "time": when.isoformat(),
            "meta": meta or {},
            "run": self.run_id.hex(),
            "tree": tree,
            "packs": sorted(self._packs.referenced),
            "files": self.files,
            "bytes": self.bytes,
        }
        key = f"snapshots/{snap_id}"
        self.bucket.put(key, self.repo.seal_object(key, doc))
        self.committed = snap_id
        self._tree.close()
        self.bucket.delete(self.lock_key)
        self._packs.keep_index()
        return snap_id

    def abort(self) -> None:
        """Give up: nothing is committed; uploaded packs stay for the next run."""
        self._packs.shutdown()
        self._tree.close()
        self.bucket.delete(self.lock_key)


def line_cuts(f: IO[bytes], most: int) -> Iterator[bytes]:
    """The lines read from ``f`` in pieces of at most ``most`` bytes, cut after a line
    whose CRC-32 ends in ten zero bits once a piece holds ``LIST_MIN`` bytes: the cuts
    follow the content, so a change early in a long list moves no cut after it (only
    the pieces around the change are new).  A piece is cut at ``most`` where no line
    end comes in time."""
    buf = bytearray()
    least = min(LIST_MIN, most)
    for line in f:
        buf += line
        if len(buf) >= least and not zlib.crc32(line) & LIST_MASK:
            yield bytes(buf)
            buf.clear()
        while len(buf) >= most:
            yield bytes(buf[:most])
            del buf[:most]
    if buf:
        yield bytes(buf)


def _check_path(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise InvalidInput(
            f"invalid path in a backup: {path!r}",
            hint="paths are relative, '/'-separated, with no '.' or '..' parts",
        )
