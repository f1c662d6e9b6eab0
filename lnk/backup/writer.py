"""Writing one snapshot: chunk, dedupe, pack, seal, commit.

Chunking is fixed-size (the repository's ``chunk_size``, 1 MiB): an agent's
state is mostly small files and append-only logs (chats), which fixed chunks
dedupe as well as content-defined ones (only a log's last chunk changes), and
fixed chunks are simpler and cheaper.  Each chunk is named by HMAC-SHA256 under
the dedup key; a chunk the repository already holds is not uploaded again.

Commit order: packs (each followed by its own index object, so an interrupted
run leaves reusable data) -> the tree -> the snapshot object, the one commit.

Speed: within a big file, up to ``INFLIGHT`` chunks are named, compressed and
sealed at once on a small thread pool (hashlib, zstandard and AES-GCM release
the GIL); small chunks are named and sealed on the calling thread, in batches
(for those, the hand-offs cost more than the pool gave); and a full pack is
uploaded by one background thread while the next fills.  What was added is in
the bucket once :meth:`SnapshotWriter.commit` returns.
Names are random, nothing is read-modified-written, so two runs at once never
corrupt each other.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import struct
import tempfile
import threading
import time as _time
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import IO, Any

import zstandard

from lnk.backup import crypto
from lnk.backup.locks import lock_doc
from lnk.backup.pack import PACK_MAGIC, blob_aad, new_name, pack_key, pin_mmap_threshold, run_info
from lnk.backup.repository import BlobRef, Repository
from lnk.errors import BackupError, InvalidInput

LOCK_REFRESH = 600.0  # seconds between refreshes of the in-progress marker
WORKERS = 2  # threads that name, compress and seal chunks
INFLIGHT = 4  # big chunks of one file being named and sealed at once
QUEUE_BYTES = 8 << 20  # plaintext queued for sealing, across files (bounds memory)
QUEUE_ITEMS = 1024  # and at most this many chunks
SMALL = 64 << 10  # a chunk this small is named at once on the calling thread
BATCH_BYTES = 1 << 20  # small chunks sealed together
BATCH_ITEMS = 256
LIST_MIN = 64 << 10  # a tree or file list is cut into pieces of at least this ...
LIST_MASK = 0x3FF  # ... then after a line whose CRC-32 has these bits zero (1 in 1024)


class _Queued:
    """Work handed to the sealing pool, in the order it was added: one big chunk
    (named and sealed there), or a batch of small chunks named already."""

    __slots__ = ("done", "fut", "id", "kinds", "size")

    def __init__(
        self,
        kinds: list[str],
        fut: Future[list[tuple[bytes, bytes | None]]],
        size: int,
        blob_id: bytes | None = None,
    ) -> None:
        self.kinds = kinds
        self.fut = fut
        self.size = size
        self.id = blob_id  # a big chunk's ID, once settled
        self.done = False  # settled into a pack (or found stored)


class SnapshotWriter:
    """One backup run.  Use as a context manager, or call :meth:`abort`."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.bucket = repo.bucket
        _ = repo.master  # a writer needs the writer secret
        pin_mmap_threshold()
        self.run_id = os.urandom(16)
        self._data_key = os.urandom(crypto.KEY_LEN)
        self._aead = crypto.aead(self._data_key)
        sealed = crypto.seal_to(repo.owner, self._data_key, run_info(repo, self.run_id))
        self._header = PACK_MAGIC + self.run_id + struct.pack(">H", len(sealed)) + sealed
        self.lock_key = f"locks/{self.run_id.hex()}"
        self._touch_lock()
        # blobs whose every copy a verify found damaged are left out: stored again
        self._known: dict[bytes, BlobRef] | None = None
        self._uploader = ThreadPoolExecutor(1, "lnk-backup-upload")
        # loaded while the caller starts walking (its first use waits for it)
        self._known_f = self._uploader.submit(repo.load_index, skip_damaged=True, missing_ok=True)
        self._pending: dict[bytes, tuple[str, int, int]] = {}  # id -> kind, offset, length
        self._parts: list[bytes] = []  # the sealed blobs of the pack being filled
        self._filled = 0
        self._referenced: set[str] = set()
        self._tree = tempfile.SpooledTemporaryFile(max_size=4 * 1024 * 1024)  # noqa: SIM115
        self._local = threading.local()  # a zstd compressor per thread
        self._pool = ThreadPoolExecutor(WORKERS, "lnk-backup-seal")
        self._upload: Future[None] | None = None
        self._queue: deque[_Queued] = deque()  # sealing, settled into packs in order
        self._queued_ids: set[bytes] = set()
        self._queued_bytes = 0
        self._batch: list[tuple[str, bytes, bytes]] = []  # small chunks: kind, ID, data
        self._batch_bytes = 0
        self.files = 0
        self.bytes = 0
        self.uploaded_blobs = 0
        self.committed: str | None = None
        self.last_line = b""  # the tree line of the last file or blob added

    @property
    def known(self) -> dict[bytes, BlobRef]:
        """Every blob the repository holds (not only in damaged packs), and this run's."""
        known = self._known
        if known is None:
            known = self._known = self._known_f.result()
        return known

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
        items: list[bytes | _Queued] = []
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
            item = self._enqueue("data", data)
            items.append(item)
            if isinstance(item, _Queued):
                big += 1
                if big >= INFLIGHT:  # bound the file's own chunks in flight
                    self._settle_until(item)
                    big = 0
        chunks = [self._resolve(i).hex() for i in items]
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
            chunks.append(self._add_chunk("data", part).hex())
            size += len(part)
        self._file_entry(path, mode, size, chunks)
        return chunks

    def add_bytes(self, path: str, mode: int, data: bytes) -> list[str]:
        """:meth:`add_file` for a file read whole already (a small one: no file object,
        no copy)."""
        _check_path(path)
        step = self.repo.chunk_size
        if len(data) <= step:
            items = [self._enqueue("data", data)] if data else []
        else:
            items = [self._enqueue("data", data[i : i + step]) for i in range(0, len(data), step)]
        chunks = [self._resolve(i).hex() for i in items]
        size = len(data)
        self._file_entry(path, mode, size, chunks)
        return chunks

    def packs_of(self, ids: bytes) -> set[str] | None:
        """The packs holding the blobs ``ids`` (32-byte IDs, end to end); None when one
        of them is neither stored nor on its way in this run (whose own packs count
        anyway)."""
        known, pending, queued = self.known, self._pending, self._queued_ids
        packs: set[str] = set()
        for at in range(0, len(ids), 32):
            i = ids[at : at + 32]
            ref = known.get(i)
            if ref is not None:
                packs.add(ref.pack)
            elif i not in pending and i not in queued:
                return None
        return packs

    def add_lines(self, lines: bytes, packs: set[str], files: int, size: int) -> None:
        """Tree lines this repository stored before, verbatim (a folder unchanged since the
        last backup), naming blobs in ``packs`` (:meth:`packs_of`), for ``files`` files of
        ``size`` bytes."""
        self._referenced |= packs
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
        if any(
            r is None and i not in self._pending and i not in self._queued_ids
            for r, i in zip(refs, ids, strict=True)
        ):
            return False
        self._referenced.update(r.pack for r in refs if r is not None)
        self._file_entry(path, mode, size, chunks)
        return True

    def add_blob(self, name: str, data: bytes) -> None:
        """Store a small piece of metadata under ``name`` (read back by name)."""
        if not name:
            raise InvalidInput("a blob needs a name")
        chunks = [
            self._add_chunk("data", data[i : i + self.repo.chunk_size]).hex()
            for i in range(0, len(data), self.repo.chunk_size)
        ]
        self._entry({"t": "b", "name": name, "size": len(data), "chunks": chunks})

    def sync(self) -> None:
        """Wait until every full pack of what was added is in the bucket (the last,
        partly filled pack waits for more, or for :meth:`commit`)."""
        self._drain()
        self._wait_upload()

    def store_blob(self, kind: str, data: bytes) -> bytes:
        """Store one blob of ``kind`` outside any file (a repair re-storing what a
        damaged pack held); its ID.  :meth:`close_without_snapshot` keeps it."""
        return self._add_chunk(kind, data)

    def close_without_snapshot(self) -> None:
        """Put every pack filled so far (each with its index) and end the run
        without a snapshot (a repair)."""
        self._drain()
        self._flush()
        self._wait_upload()
        self.abort()

    def _file_entry(self, path: str, mode: int, size: int, chunks: list[str]) -> None:
        self._entry({"t": "f", "path": path, "mode": mode & 0o7777, "size": size, "chunks": chunks})
        self.files += 1
        self.bytes += size

    def _entry(self, doc: dict[str, Any]) -> None:
        self.last_line = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
        self._tree.write(self.last_line)

    def _name(self, kind: str, data: bytes) -> bytes:
        h = hmac.new(self.repo.dedup_key, kind.encode() + b"\0", hashlib.sha256)
        h.update(data)
        return h.digest()

    def _seal(
        self, kind: str, data: bytes, blob_id: bytes | None = None
    ) -> tuple[bytes, bytes | None]:
        """(blob ID, sealed blob), or (ID, None) when the repository holds it already.
        Runs on the pool: reads ``known`` only."""
        if blob_id is None:
            blob_id = self._name(kind, data)
        if blob_id in self.known:
            return blob_id, None
        cctx = getattr(self._local, "cctx", None)
        if cctx is None:
            cctx = self._local.cctx = zstandard.ZstdCompressor(level=3)
        packed = cctx.compress(data)
        plain = b"\x01" + packed if len(packed) < len(data) else b"\x00" + data
        return blob_id, crypto.encrypt_with(self._aead, plain, blob_aad(self.repo, kind, blob_id))

    def _seal_batch(
        self, batch: list[tuple[str, bytes, bytes]]
    ) -> list[tuple[bytes, bytes | None]]:
        return [self._seal(kind, data, blob_id) for kind, blob_id, data in batch]

    def _seal_one(self, kind: str, data: bytes) -> list[tuple[bytes, bytes | None]]:
        return [self._seal(kind, data)]

    def _enqueue(self, kind: str, data: bytes) -> bytes | _Queued:
        """Queue a chunk: a small one is named here and joins a batch (sealed here, a
        batch at a time); returns its ID, or for a big chunk (sealed on the pool) its
        place in the queue (the ID comes when it is settled)."""
        if len(data) <= SMALL:
            blob_id = self._name(kind, data)
            ref = self.known.get(blob_id)
            if ref is not None:
                self._referenced.add(ref.pack)
                return blob_id
            if blob_id in self._pending or blob_id in self._queued_ids:
                return blob_id
            self._queued_ids.add(blob_id)
            self._batch.append((kind, blob_id, data))
            self._batch_bytes += len(data)
            if self._batch_bytes >= BATCH_BYTES or len(self._batch) >= BATCH_ITEMS:
                self._submit_batch()
            return blob_id
        self._submit_batch()
        item = _Queued([kind], self._pool.submit(self._seal_one, kind, data), len(data))
        self._push(item)
        return item

    def _submit_batch(self) -> None:
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        size, self._batch_bytes = self._batch_bytes, 0
        # sealed here: measured on 100,000 small files, handing batches to the pool
        # cost more in GIL hand-offs than the second core gave (11.4 s against 10.5 s)
        fut: Future[list[tuple[bytes, bytes | None]]] = Future()
        fut.set_result(self._seal_batch(batch))
        self._push(_Queued([k for k, _, _ in batch], fut, size))

    def _push(self, item: _Queued) -> None:
        self._queue.append(item)
        self._queued_bytes += item.size
        while len(self._queue) > QUEUE_ITEMS or self._queued_bytes > QUEUE_BYTES:
            self._settle_one()

    def _resolve(self, item: bytes | _Queued) -> bytes:
        if isinstance(item, bytes):
            return item
        self._settle_until(item)
        assert item.id is not None
        return item.id

    def _settle_until(self, item: _Queued) -> None:
        while not item.done:
            self._settle_one()

    def _drain(self) -> None:
        self._submit_batch()
        while self._queue:
            self._settle_one()

    def _settle_one(self) -> None:
        """Put the oldest sealed work into the pack (in the order chunks were added)."""
        item = self._queue.popleft()
        self._queued_bytes -= item.size
        results = item.fut.result()
        item.done = True
        if len(results) == 1:
            item.id = results[0][0]
        for kind, (blob_id, sealed) in zip(item.kinds, results, strict=True):
            self._queued_ids.discard(blob_id)
            ref = self.known.get(blob_id)
            if ref is not None:
                self._referenced.add(ref.pack)
                continue
            if blob_id in self._pending:
                continue
            assert sealed is not None  # known only grows: a chunk the pool found is known
            offset = len(self._header) + self._filled
            self._parts.append(sealed)
            self._filled += len(sealed)
            self._pending[blob_id] = (kind, offset, len(sealed))
            self.uploaded_blobs += 1
            if len(self._header) + self._filled >= self.repo.pack_size:
                self._flush()

    def _add_chunk(self, kind: str, data: bytes) -> bytes:
        return self._resolve(self._enqueue(kind, data))

    def _flush(self) -> None:
        """Hand the pack (and then its index) to the upload thread."""
        if not self._pending:
            return
        name = new_name()
        body = b"".join([self._header, *self._parts])  # the one copy
        self._parts, self._filled = [], 0
        index = {
            "pack": name,
            "run": self.run_id.hex(),
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "blobs": [[i.hex(), k, o, n] for i, (k, o, n) in self._pending.items()],
        }
        self._wait_upload()  # one pack in the air at a time
        self._upload = self._uploader.submit(self._put_pack, name, body, index)
        for blob_id, (kind, offset, length) in self._pending.items():
            self.known[blob_id] = BlobRef(name, offset, length, kind)
        self._referenced.add(name)
        self._pending.clear()

    def _put_pack(self, name: str, body: bytes, index: dict[str, Any]) -> None:
        self.bucket.put(pack_key(name), body)
        key = f"index/{name}"
        self.bucket.put(key, self.repo.seal_object(key, index))

    def _wait_upload(self) -> None:
        up, self._upload = self._upload, None
        if up is not None:
            up.result()
        self._keep_lock()

    def _keep_lock(self) -> None:
        if _time.monotonic() - self._lock_time > LOCK_REFRESH:
            self._touch_lock()

    def _shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._uploader.shutdown(wait=True)

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
            self._add_chunk("tree", part).hex()
            for part in line_cuts(self._tree, self.repo.chunk_size)
        ]
        self._drain()
        self._flush()
        self._wait_upload()
        self._shutdown()
        present = {k.rsplit("/", 1)[1] for k, _ in self.bucket.list("data/")}
        missing = self._referenced - present
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
            "packs": sorted(self._referenced),
            "files": self.files,
            "bytes": self.bytes,
        }
        key = f"snapshots/{snap_id}"
        self.bucket.put(key, self.repo.seal_object(key, doc))
        self.committed = snap_id
        self._tree.close()
        self.bucket.delete(self.lock_key)
        return snap_id

    def abort(self) -> None:
        """Give up: nothing is committed; uploaded packs stay for the next run."""
        self._shutdown()
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
