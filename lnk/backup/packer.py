"""Chunks into packs: how one backup run stores its blobs.

A chunk is named by HMAC-SHA256 under the dedup key; one the repository already
holds (or this run already stores) is not stored again.  The others are
compressed and sealed under the run's data key: within a big file, up to
``INFLIGHT`` (``writer.py``) chunks at once on a small thread pool (hashlib,
zstandard and AES-GCM release the GIL); small chunks are named on the calling
thread and sealed in batches, there for a run's first few and then by a second
process (``sealer.py``: for those, thread hand-offs cost more than the pool
gave).  Sealed blobs fill packs in the order their chunks were added, and a full pack, then its own index object, is uploaded by one background thread
while the next fills.  ``SnapshotWriter`` (``writer.py``) owns one ``Packer``.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import zstandard

from lnk.backup import crypto, indexcache, sealer
from lnk.backup.blobindex import BlobIndex, BlobRef
from lnk.backup.pack import PACK_MAGIC, blob_name, new_name, pack_key, run_info, seal_blob
from lnk.backup.repository import Repository

LEVEL = 3  # zstd's level for blobs
WORKERS = 2  # threads that name, compress and seal chunks
QUEUE_BYTES = 8 << 20  # plaintext queued for sealing, across files (bounds memory)
QUEUE_ITEMS = 1024  # and at most this many chunks
SMALL = 64 << 10  # a chunk this small is named at once on the calling thread
BATCH_BYTES = 1 << 20  # small chunks sealed together
BATCH_ITEMS = 256


class Queued:
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


class Packer:
    """The blobs of one run (``run_id``): named, sealed, packed and uploaded in order.

    ``on_wait`` is called each time the packer has waited for an upload (the run
    keeps its in-progress marker fresh there)."""

    def __init__(
        self,
        repo: Repository,
        run_id: bytes,
        on_wait: Callable[[], None],
        index_kept: Path | None = None,
    ) -> None:
        self.repo = repo
        self.bucket = repo.bucket
        self.run_id = run_id
        self._on_wait = on_wait
        data_key = self._data_key = os.urandom(crypto.KEY_LEN)
        self._aead = crypto.aead(data_key)
        sealed = crypto.seal_to(repo.owner, data_key, run_info(repo, run_id))
        self._header = PACK_MAGIC + run_id + struct.pack(">H", len(sealed)) + sealed
        # blobs whose every copy a verify found damaged are left out: stored again
        self._known: BlobIndex | None = None
        self._uploader = ThreadPoolExecutor(1, "lnk-backup-upload")
        # loaded while the caller starts walking (its first use waits for it)
        self._index_kept = index_kept
        self._loaded = self._uploader.submit(self._load_index)
        self._added_packs: set[str] = set()  # the packs this run uploaded
        self._pending: dict[bytes, tuple[str, int, int]] = {}  # id -> kind, offset, length
        self._parts: list[bytes] = []  # the sealed blobs of the pack being filled
        self._filled = 0
        self.referenced: set[str] = set()  # the packs this run's snapshot names
        self._local = threading.local()  # a zstd compressor per thread
        self._pool = ThreadPoolExecutor(WORKERS, "lnk-backup-seal")
        self._upload: Future[None] | None = None
        self._queue: deque[Queued] = deque()  # sealing, settled into packs in order
        self._queued_ids: set[bytes] = set()
        self._batches = 0
        self._sealer: sealer.SealProcess | None = None  # small chunks' second process
        self._sealer_failed = False  # it could not start: batches are sealed here
        self._queued_bytes = 0
        self._batch: list[tuple[str, bytes, bytes]] = []  # small chunks: kind, ID, data
        self._batch_bytes = 0
        self.uploaded_blobs = 0

    def _load_index(self) -> indexcache.Kept:
        """The repository's index and the packs it holds (through the kept index, if any)."""
        if self._index_kept is not None:
            return indexcache.load_kept(self.repo, self._index_kept)
        index = self.repo.load_index(skip_damaged=True, missing_ok=True)
        return indexcache.Kept(index, frozenset())

    @property
    def known(self) -> BlobIndex:
        """Every blob the repository holds (not only in damaged packs), and this run's."""
        known = self._known
        if known is None:
            known = self._known = self._loaded.result().index
        return known

    def on_its_way(self, blob_id: bytes) -> bool:
        """Whether this run stores ``blob_id`` but has not put it in a pack yet."""
        return blob_id in self._pending or blob_id in self._queued_ids

    def add_chunk(self, kind: str, data: bytes) -> bytes:
        return self.resolve(self.enqueue(kind, data))

    def _name(self, kind: str, data: bytes) -> bytes:
        return blob_name(self.repo.dedup_key, kind, data)

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
            cctx = self._local.cctx = zstandard.ZstdCompressor(level=LEVEL)
        return blob_id, seal_blob(self._aead, cctx, self.repo.id_bytes, kind, blob_id, data)

    def _seal_batch(
        self, batch: list[tuple[str, bytes, bytes]]
    ) -> list[tuple[bytes, bytes | None]]:
        return [self._seal(kind, data, blob_id) for kind, blob_id, data in batch]

    def _seal_one(self, kind: str, data: bytes) -> list[tuple[bytes, bytes | None]]:
        return [self._seal(kind, data)]

    def enqueue(self, kind: str, data: bytes) -> bytes | Queued:
        """Queue a chunk: a small one is named here and joins a batch (sealed here, a
        batch at a time); returns its ID, or for a big chunk (sealed on the pool) its
        place in the queue (the ID comes when it is settled)."""
        if len(data) <= SMALL:
            blob_id = self._name(kind, data)
            ref = self.known.get(blob_id)
            if ref is not None:
                self.referenced.add(ref.pack)
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
        item = Queued([kind], self._pool.submit(self._seal_one, kind, data), len(data))
        self._push(item)
        return item

    @property
    def reader(self) -> sealer.SealProcess | None:
        """The second process, to read small files (``small_reads.py``), once it runs."""
        return self._sealer

    def add_sealed(self, kind: str, blob_id: bytes, sealed: bytes) -> None:
        """A chunk named and sealed elsewhere (the second process read its file): into
        the pack being filled, unless the repository or this run holds it already."""
        ref = self.known.get(blob_id)
        if ref is not None:
            self.referenced.add(ref.pack)
            return
        if blob_id in self._pending or blob_id in self._queued_ids:
            return
        self._put(kind, blob_id, sealed)

    def _put(self, kind: str, blob_id: bytes, sealed: bytes) -> None:
        offset = len(self._header) + self._filled
        self._parts.append(sealed)
        self._filled += len(sealed)
        self._pending[blob_id] = (kind, offset, len(sealed))
        self.uploaded_blobs += 1
        if len(self._header) + self._filled >= self.repo.pack_size:
            self.flush()

    def _submit_batch(self) -> None:
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        size, self._batch_bytes = self._batch_bytes, 0
        # sealed by a second process once a run has a few batches (handing them to a
        # thread pool cost more in GIL hand-offs than the second core gave)
        self._batches += 1
        if self._sealer is None and not self._sealer_failed and self._batches > sealer.START_AFTER:
            try:
                self._sealer = sealer.SealProcess(
                    self._data_key,
                    self.repo.id_bytes,
                    LEVEL,
                    self.repo.dedup_key,
                    self.repo.chunk_size,
                )
            except OSError:
                self._sealer_failed = True
        if self._sealer is not None:
            fut = self._sealer.submit(batch)
        else:
            fut = Future()
            fut.set_result(self._seal_batch(batch))
        self._push(Queued([k for k, _, _ in batch], fut, size))

    def _push(self, item: Queued) -> None:
        self._queue.append(item)
        self._queued_bytes += item.size
        while len(self._queue) > QUEUE_ITEMS or self._queued_bytes > QUEUE_BYTES:
            self._settle_one()

    def resolve(self, item: bytes | Queued) -> bytes:
        if isinstance(item, bytes):
            return item
        self.settle_until(item)
        assert item.id is not None
        return item.id

    def settle_until(self, item: Queued) -> None:
        while not item.done:
            self._settle_one()

    def drain(self) -> None:
        """Put everything queued into packs (the last one may stay partly filled)."""
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
                self.referenced.add(ref.pack)
                continue
            if blob_id in self._pending:
                continue
            assert sealed is not None  # known only grows: a chunk the pool found is known
            self._put(kind, blob_id, sealed)

    def flush(self) -> None:
        """Hand the pack (and then its index) to the upload thread."""
        if not self._pending:
            return
        name = new_name()
        # one pack in the air at a time, and gone before this one is joined: at most
        # the blobs filling a pack and one pack's bytes are held, never three packs' worth
        self.wait_upload()
        body = b"".join([self._header, *self._parts])  # the one copy
        self._parts, self._filled = [], 0
        index = {
            "pack": name,
            "run": self.run_id.hex(),
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "blobs": [[i.hex(), k, o, n] for i, (k, o, n) in self._pending.items()],
        }
        self._upload = self._uploader.submit(self._put_pack, name, body, index)
        self._added_packs.add(name)
        for blob_id, (kind, offset, length) in self._pending.items():
            self.known[blob_id] = BlobRef(name, offset, length, kind)
        self.referenced.add(name)
        self._pending.clear()

    def _put_pack(self, name: str, body: bytes, index: dict[str, Any]) -> None:
        self.bucket.put(pack_key(name), body)
        key = f"index/{name}"
        self.bucket.put(key, self.repo.seal_object(key, index))

    def wait_upload(self) -> None:
        up, self._upload = self._upload, None
        if up is not None:
            up.result()
        self._on_wait()

    def keep_index(self) -> None:
        """Once every pack of this run is uploaded: keep the index with this run's blobs
        in it for the next backup (:func:`lnk.backup.indexcache.keep_after`)."""
        if self._index_kept is not None:
            kept = self._loaded.result()  # its index is ``known``: this run's blobs set in
            indexcache.keep_after(self._index_kept, self.repo.id, kept, self._added_packs)

    def shutdown(self) -> None:
        if self._sealer is not None:
            self._sealer.close()
            self._sealer = None
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._uploader.shutdown(wait=True)
