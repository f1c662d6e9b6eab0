"""Writing one snapshot: chunk, dedupe, pack, seal, commit.

Chunking is fixed-size (the repository's ``chunk_size``, 1 MiB): an agent's
state is mostly small files and append-only logs (chats), which fixed chunks
dedupe as well as content-defined ones (only a log's last chunk changes), and
fixed chunks are simpler and cheaper.  Each chunk is named by HMAC-SHA256 under
the dedup key; a chunk the repository already holds is not uploaded again.

Commit order: packs (each followed by its own index object, so an interrupted
run leaves reusable data) -> the tree -> the snapshot object, the one commit.

Speed: within a file, up to ``INFLIGHT`` chunks are named, compressed and
sealed at once on a small thread pool (hashlib, zstandard and AES-GCM release
the GIL), and a full pack is uploaded by one background thread while the next
fills; both are waited for before :meth:`SnapshotWriter.add_file` returns, so
what it added is in the bucket when it returns.
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
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import IO, Any

import zstandard

from lnk.backup import crypto
from lnk.backup.locks import lock_doc
from lnk.backup.pack import PACK_MAGIC, blob_aad, new_name, pack_key, run_info
from lnk.backup.repository import BlobRef, Repository
from lnk.errors import BackupError, InvalidInput

LOCK_REFRESH = 600.0  # seconds between refreshes of the in-progress marker
WORKERS = 2  # threads that name, compress and seal chunks
INFLIGHT = 4  # chunks being sealed at once (bounds memory: about 2 MiB each)


class SnapshotWriter:
    """One backup run.  Use as a context manager, or call :meth:`abort`."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo
        self.bucket = repo.bucket
        _ = repo.master  # a writer needs the writer secret
        self.run_id = os.urandom(16)
        self._data_key = os.urandom(crypto.KEY_LEN)
        sealed = crypto.seal_to(repo.owner, self._data_key, run_info(repo, self.run_id))
        self._header = PACK_MAGIC + self.run_id + struct.pack(">H", len(sealed)) + sealed
        self.lock_key = f"locks/{self.run_id.hex()}"
        self._touch_lock()
        # blobs whose every copy a verify found damaged are left out: stored again
        self.known: dict[bytes, BlobRef] = repo.load_index(skip_damaged=True, missing_ok=True)
        self._pending: dict[bytes, tuple[str, int, int]] = {}  # id -> kind, offset, length
        self._buf = bytearray()
        self._referenced: set[str] = set()
        self._tree = tempfile.SpooledTemporaryFile(max_size=4 * 1024 * 1024)  # noqa: SIM115
        self._local = threading.local()  # a zstd compressor per thread
        self._pool = ThreadPoolExecutor(WORKERS, "lnk-backup-seal")
        self._uploader = ThreadPoolExecutor(1, "lnk-backup-upload")
        self._upload: Future[None] | None = None
        self.files = 0
        self.bytes = 0
        self.uploaded_blobs = 0
        self.committed: str | None = None

    def __enter__(self) -> SnapshotWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.committed is None:
            self.abort()

    # ---- adding -------------------------------------------------------------

    def add_file(self, path: str, mode: int, fileobj: IO[bytes]) -> list[str]:
        """Store a file read from ``fileobj`` (streamed, one chunk at a time)
        under the relative ``path`` with permission bits ``mode``; returns its
        chunk IDs (hex), for :meth:`add_known` in a later run."""
        _check_path(path)
        inflight: deque[Future[tuple[bytes, bytes | None]]] = deque()
        chunks: list[str] = []
        size = 0
        try:
            while True:
                data = fileobj.read(self.repo.chunk_size)
                if not data:
                    break
                while len(data) < self.repo.chunk_size:  # short reads from pipes
                    more = fileobj.read(self.repo.chunk_size - len(data))
                    if not more:
                        break
                    data += more
                inflight.append(self._pool.submit(self._seal, "data", data))
                size += len(data)
                if len(inflight) >= INFLIGHT:
                    chunks.append(self._settle("data", inflight.popleft()).hex())
            while inflight:
                chunks.append(self._settle("data", inflight.popleft()).hex())
            self._wait_upload()
        finally:
            for fut in inflight:
                fut.cancel()
        self._entry({"t": "f", "path": path, "mode": mode & 0o7777, "size": size, "chunks": chunks})
        self.files += 1
        self.bytes += size
        return chunks

    def add_known(self, path: str, mode: int, size: int, chunks: list[str]) -> bool:
        """Store a file whose chunks (from an earlier :meth:`add_file`) the repository
        holds, without reading it; False (nothing added) if any of them is gone."""
        _check_path(path)
        try:
            refs = [self.known.get(bytes.fromhex(c)) for c in chunks]
        except ValueError:
            return False
        if any(r is None for r in refs):
            return False
        self._referenced.update(r.pack for r in refs if r is not None)
        self._entry({"t": "f", "path": path, "mode": mode & 0o7777, "size": size, "chunks": chunks})
        self.files += 1
        self.bytes += size
        return True

    def add_blob(self, name: str, data: bytes) -> None:
        """Store a small piece of metadata under ``name`` (read back by name)."""
        if not name:
            raise InvalidInput("a blob needs a name")
        chunks = [
            self._add_chunk("data", data[i : i + self.repo.chunk_size]).hex()
            for i in range(0, len(data), self.repo.chunk_size)
        ]
        self._wait_upload()
        self._entry({"t": "b", "name": name, "size": len(data), "chunks": chunks})

    def store_blob(self, kind: str, data: bytes) -> bytes:
        """Store one blob of ``kind`` outside any file (a repair re-storing what a
        damaged pack held); its ID.  :meth:`close_without_snapshot` keeps it."""
        return self._add_chunk(kind, data)

    def close_without_snapshot(self) -> None:
        """Put every pack filled so far (each with its index) and end the run
        without a snapshot (a repair)."""
        self._flush()
        self._wait_upload()
        self.abort()

    def _entry(self, doc: dict[str, Any]) -> None:
        self._tree.write(json.dumps(doc, separators=(",", ":")).encode() + b"\n")

    def _seal(self, kind: str, data: bytes) -> tuple[bytes, bytes | None]:
        """(blob ID, sealed blob), or (ID, None) when the repository holds it already.
        Runs on the pool: reads ``known`` only."""
        h = hmac.new(self.repo.dedup_key, kind.encode() + b"\0", hashlib.sha256)
        h.update(data)
        blob_id = h.digest()
        if blob_id in self.known:
            return blob_id, None
        cctx = getattr(self._local, "cctx", None)
        if cctx is None:
            cctx = self._local.cctx = zstandard.ZstdCompressor(level=3)
        packed = cctx.compress(data)
        plain = b"\x01" + packed if len(packed) < len(data) else b"\x00" + data
        return blob_id, crypto.encrypt(self._data_key, plain, blob_aad(self.repo, kind, blob_id))

    def _settle(self, kind: str, fut: Future[tuple[bytes, bytes | None]]) -> bytes:
        """Put a sealed chunk into the pack (in the order chunks were added)."""
        blob_id, sealed = fut.result()
        ref = self.known.get(blob_id)
        if ref is not None:
            self._referenced.add(ref.pack)
            return blob_id
        if blob_id in self._pending:
            return blob_id
        assert sealed is not None  # known only grows: a chunk the pool found is known
        offset = len(self._header) + len(self._buf)
        self._buf += sealed
        self._pending[blob_id] = (kind, offset, len(sealed))
        self.uploaded_blobs += 1
        if len(self._header) + len(self._buf) >= self.repo.pack_size:
            self._flush()
        return blob_id

    def _add_chunk(self, kind: str, data: bytes) -> bytes:
        return self._settle(kind, self._pool.submit(self._seal, kind, data))

    def _flush(self) -> None:
        """Hand the pack (and then its index) to the upload thread."""
        if not self._pending:
            return
        name = new_name()
        self._buf[:0] = self._header
        body = bytes(self._buf)  # the one copy; the buffer is dropped now
        self._buf = bytearray()
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
        tree: list[str] = []
        self._tree.seek(0)
        while True:
            part = self._tree.read(self.repo.chunk_size)
            if not part:
                break
            tree.append(self._add_chunk("tree", part).hex())
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


def _check_path(path: str) -> None:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise InvalidInput(
            f"invalid path in a backup: {path!r}",
            hint="paths are relative, '/'-separated, with no '.' or '..' parts",
        )
