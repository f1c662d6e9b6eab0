"""Reading one snapshot back: entries, files, blobs, a whole restore.

Needs the owner's private key: every data key is sealed to it.  Memory stays
bounded: packs are read in ranges (each pack's header once, then spans of
nearby blobs of at most ``SPAN_MAX`` bytes), never whole, and files are
streamed chunk by chunk.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import threading
from collections import OrderedDict, deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from lnk.backup import crypto
from lnk.backup.blobindex import BlobIndex, BlobRef
from lnk.backup.pack import PACK_MAGIC, blob_aad, pack_key, pin_mmap_threshold, run_info
from lnk.backup.repository import Repository
from lnk.errors import BackupError, NotFound, Refused
from lnk.formats.keys import ReceiverKey

READ_AHEAD = 64  # chunks a restore's read-ahead asks for ahead of the one being written
BYTES_AHEAD = 8 << 20  # ... and sealed bytes of them at most
SPAN_MAX = 2 << 20  # one ranged read: nearby blobs of one pack, at most this many bytes
SPAN_BLOBS = READ_AHEAD // 4  # ... and this many blobs of the read-ahead (so the reads
# of its last quarter are under way while its first three are written)
SPAN_GAP = 256 << 10  # a blob this close after a span's end joins it (the gap is read too)
# how the writer starts the tree line of a file under agent/ (SnapshotWriter._file_entry):
# a reader looking for the snapshot's other entries passes over these unparsed
AGENT_FILE_LINE = b'{"t":"f","path":"agent/'
SPANS_KEPT = 2  # spans a reader outside the read-ahead keeps (a tree's and a file's)
HEAD_READ = 2048  # a read of a pack's header: magic, run ID and the sealed data key (about
# 1,170 bytes with the hybrid KEM), so one read
FETCHERS = 2  # concurrent ranged reads of the read-ahead


class _Span:
    """One ranged read of a pack: bytes ``start`` to ``end``, fetched once."""

    __slots__ = ("blobs", "end", "fut", "pack", "start")

    def __init__(self, pack: str, start: int, end: int) -> None:
        self.pack, self.start, self.end = pack, start, end
        self.blobs = 1
        self.fut: Future[bytes] | None = None

    def takes(self, ref: BlobRef) -> bool:
        """Whether ``ref`` can join this span (not yet fetched)."""
        return (
            self.fut is None
            and ref.pack == self.pack
            and self.start <= ref.offset <= self.end + SPAN_GAP
            and ref.offset + ref.length - self.start <= SPAN_MAX
        )

    def full(self) -> bool:
        return self.blobs >= SPAN_BLOBS or self.end - self.start >= SPAN_MAX

    def holds(self, ref: BlobRef) -> bool:
        return (
            ref.pack == self.pack
            and self.start <= ref.offset
            and ref.offset + ref.length <= self.end
        )


@dataclass(frozen=True)
class Entry:
    """A file (``kind == "file"``) or a named blob (``kind == "blob"``)."""

    kind: str
    path: str
    mode: int
    size: int
    chunks: tuple[str, ...]


class Zstd(bytes):
    """A data chunk still in the zstd frame it was stored in (``read_ahead(...,
    compressed=True)``): whoever takes it decompresses it, bounded by the size its
    frame declares (the restore's parent does, so the two processes share the work)."""


class SnapshotReader:
    def __init__(
        self, repo: Repository, snapshot_id: str, receiver_key: ReceiverKey | None = None
    ) -> None:
        key = receiver_key or repo.receiver
        if key is None:
            raise Refused(
                "reading a backup needs the owner's private key; this handle has only "
                "the public key",
                hint="open the repository with the owner's backup key",
            )
        if key.public.raw != repo.owner.raw:
            raise Refused(
                f"this key is not the owner's key of {repo.bucket.describe()}",
                hint="use the backup key the repository was made for",
            )
        if repo.receiver is None:
            repo = repo.unlock(receiver_key=key)
        self.repo = repo
        self.key = key
        self.info = repo.snapshot(snapshot_id)
        # the snapshot's own packs; a blob missing there or failing to open is looked
        # for in every other pack (a backup after a verify may have stored it again)
        self.index: BlobIndex = repo.load_index(self.info.packs, missing_ok=True)
        self._copies: dict[bytes, list[BlobRef]] | None = None
        self._runs: dict[bytes, Any] = {}  # run ID -> the AES-GCM context of its data key
        self._pack_runs: dict[str, Any] = {}  # pack -> that context (its header read once)
        self._head_lock = threading.Lock()
        self._local = threading.local()  # a zstd decompressor per thread
        self._spans: OrderedDict[tuple[str, int], bytes] = OrderedDict()  # (pack, start)

    # ---- blobs --------------------------------------------------------------

    def _pack_aead(self, name: str) -> Any:
        """The AES-GCM context of the data key sealed in pack ``name``'s header (its
        header read once per pack, its key opened once per run)."""
        ctx = self._pack_runs.get(name)
        if ctx is not None:
            return ctx
        with self._head_lock:  # (two fetchers starting on one pack read its header once)
            ctx = self._pack_runs.get(name)
            if ctx is None:
                ctx = self._pack_runs[name] = self._read_head(name)
            return ctx

    def _read_head(self, name: str) -> Any:
        key = pack_key(name)
        head = self.repo.bucket.get_range(key, 0, HEAD_READ)
        start = len(PACK_MAGIC)
        if not head.startswith(PACK_MAGIC) or len(head) < start + 18:
            raise BackupError(f"pack {name} is damaged (no header)", hint="run a verify")
        run_id = head[start : start + 16]
        ctx = self._runs.get(run_id)
        if ctx is None:
            (n,) = struct.unpack(">H", head[start + 16 : start + 18])
            if len(head) < start + 18 + n:
                head = self.repo.bucket.get_range(key, 0, start + 18 + n)
            sealed = head[start + 18 : start + 18 + n]
            data_key = crypto.open_with(self.key, sealed, run_info(self.repo, run_id))
            ctx = self._runs[run_id] = crypto.aead(data_key)
        return ctx

    def _fetch(self, span: _Span) -> bytes:
        """A span's bytes (its pack's header read first if it was not yet)."""
        self._pack_aead(span.pack)
        return self.repo.bucket.get_range(pack_key(span.pack), span.start, span.end - span.start)

    def chunk(self, blob_hex: str, kind: str = "data") -> bytes:
        blob_id = bytes.fromhex(blob_hex)
        ref = self.index.get(blob_id)
        first: BackupError | None = None
        if ref is not None and ref.kind == kind:
            try:
                return self.open_blob(ref, blob_id)
            except (BackupError, NotFound) as e:
                first = e if isinstance(e, BackupError) else BackupError(e.message)
        if self._copies is None:
            self._copies = self.repo.blob_copies()
        for other in self._copies.get(blob_id, []):
            if other == ref or other.kind != kind:
                continue
            try:
                plain = self.open_blob(other, blob_id)
            except (BackupError, NotFound):
                continue
            self.index[blob_id] = other
            return plain
        if first is not None:
            raise BackupError(
                f"snapshot {self.info.id} needs a blob that is damaged ({first.message})",
                hint="run lnk agent backup verify --read-data, then back up again to store it anew",
            )
        raise BackupError(
            f"snapshot {self.info.id} needs a blob no index lists",
            hint="run a verify; the repository is missing data",
        )

    def open_blob(self, ref: BlobRef, blob_id: bytes) -> bytes:
        """The plaintext of the blob ``blob_id`` stored at ``ref`` (authenticated).  A
        blob is read with the ones after it in its pack, up to ``SPAN_MAX`` bytes, and
        the last ``SPANS_KEPT`` such spans are kept: reading in pack order reads each
        byte once."""
        for (pack, start), data in self._spans.items():
            if pack == ref.pack and start <= ref.offset:
                span = _Span(pack, start, start + len(data))
                if span.holds(ref):
                    self._spans.move_to_end((pack, start))
                    return self._open_in(data, span, ref, blob_id)
        span = _Span(ref.pack, ref.offset, ref.offset + max(ref.length, SPAN_MAX))
        data = self._fetch(span)
        self._spans[(span.pack, span.start)] = data
        while len(self._spans) > SPANS_KEPT:
            self._spans.popitem(last=False)
        return self._open_in(data, span, ref, blob_id)

    def _open_in(
        self, data: bytes, span: _Span, ref: BlobRef, blob_id: bytes, compressed: bool = False
    ) -> bytes:
        """Open the blob at ``ref`` in the bytes ``data`` of ``span`` (thread-safe); with
        ``compressed``, one stored compressed is left in its frame (a :class:`Zstd`)."""
        ctx = self._pack_aead(ref.pack)
        at = ref.offset - span.start
        sealed = data[at : at + ref.length]
        plain = crypto.decrypt_with(
            ctx, sealed, blob_aad(self.repo, ref.kind, blob_id), f"a blob of pack {ref.pack}"
        )
        if plain[:1] == b"\x01":
            if compressed:
                return Zstd(memoryview(plain)[1:])
            dctx = getattr(self._local, "dctx", None)
            if dctx is None:
                dctx = self._local.dctx = zstandard.ZstdDecompressor()
            return dctx.decompress(plain[1:])
        return plain[1:]

    # ---- entries ------------------------------------------------------------

    def entries(self, skip: bytes = b"") -> Iterator[Entry]:
        """Every entry, in the order it was added; lines that start with ``skip`` (a
        form the writer gives entries the caller has no use for, e.g.
        :data:`AGENT_FILE_LINE`) are passed over unparsed."""
        carry = b""
        for blob_hex in self.info.tree:
            carry += self.chunk(blob_hex, "tree")
            *lines, carry = carry.split(b"\n")
            for line in lines:
                if not skip or not line.startswith(skip):
                    yield _entry(line)
        if carry.strip() and (not skip or not carry.startswith(skip)):
            yield _entry(carry)

    def open(self, entry: Entry) -> Iterator[bytes]:
        """The entry's content, chunk by chunk."""
        for blob_hex in entry.chunks:
            yield self.chunk(blob_hex)

    def read_ahead(
        self, entries: Iterator[Entry], window: int = READ_AHEAD, compressed: bool = False
    ) -> Generator[tuple[Entry, Iterator[bytes]], None, None]:
        """Each entry with its content, in order, while the next ``window`` chunks (at
        most ``BYTES_AHEAD`` of sealed bytes) are fetched: nearby blobs of one pack as
        one ranged read, ``FETCHERS`` reads at once; blobs are opened on this thread (a
        hand-off per small blob costs more than it saves).  A blob that fails there is
        read again through :meth:`chunk` (which looks for other copies).  Consume each
        entry's content before asking for the next entry.  ``compressed``: chunks stored
        compressed come as :class:`Zstd` (see :meth:`_open_in`)."""
        pin_mmap_threshold()
        ahead, here = itertools.tee(entries)
        todo = (c for e in ahead for c in e.chunks)
        fetch = ThreadPoolExecutor(FETCHERS, "lnk-restore-fetch")
        pending: deque[tuple[str, BlobRef | None, _Span | None]] = deque()
        held = [0]  # sealed bytes of the blobs pending
        last: list[_Span | None] = [None]  # the span still taking blobs

        def send(span: _Span) -> None:
            if span.fut is None:
                span.fut = fetch.submit(self._fetch, span)
            if last[0] is span:
                last[0] = None

        def fill() -> None:
            while len(pending) < window and (held[0] < BYTES_AHEAD or not pending):
                blob_hex = next(todo, None)
                if blob_hex is None:
                    if last[0] is not None:
                        send(last[0])  # the last blobs: nothing more joins
                    return
                ref = self.index.get(bytes.fromhex(blob_hex))
                if ref is None or ref.kind != "data":
                    pending.append((blob_hex, None, None))
                    continue
                span = last[0]
                if span is not None and span.takes(ref):
                    span.end = max(span.end, ref.offset + ref.length)
                    span.blobs += 1
                else:
                    if span is not None:
                        send(span)
                    span = last[0] = _Span(ref.pack, ref.offset, ref.offset + ref.length)
                pending.append((blob_hex, ref, span))
                held[0] += ref.length
                if span.full():
                    send(span)

        def take() -> bytes:
            fill()
            blob_hex, ref, span = pending.popleft()
            if ref is None or span is None:
                return self.chunk(blob_hex)
            held[0] -= ref.length
            send(span)
            assert span.fut is not None
            try:
                blob_id = bytes.fromhex(blob_hex)
                return self._open_in(span.fut.result(), span, ref, blob_id, compressed)
            except (BackupError, NotFound):
                return self.chunk(blob_hex)

        def content(n: int, used: list[int]) -> Iterator[bytes]:
            while used[0] < n:
                used[0] += 1
                yield take()

        try:
            for e in here:
                used = [0]
                yield e, content(len(e.chunks), used)
                while used[0] < len(e.chunks):  # not consumed: keep the order
                    used[0] += 1
                    take()
        finally:
            for _h, _r, sp in pending:
                if sp is not None and sp.fut is not None:
                    sp.fut.cancel()
            fetch.shutdown(wait=True, cancel_futures=True)

    def read_blob(self, name: str) -> bytes:
        for e in self.entries():
            if e.kind == "blob" and e.path == name:
                return b"".join(self.open(e))
        raise NotFound(f"snapshot {self.info.id} has no blob {name!r}")

    def restore(self, dest: Path) -> int:
        """Write every file into ``dest`` (made if missing); returns the count."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        root = dest.resolve()
        count = 0
        for e in self.entries():
            if e.kind != "file":
                continue
            target = (root / e.path).resolve()
            if root not in target.parents:
                raise BackupError(f"snapshot {self.info.id} names a path outside: {e.path!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.lnk-restore")
            with open(tmp, "wb") as f:
                for part in self.open(e):
                    f.write(part)
            os.chmod(tmp, e.mode)
            os.replace(tmp, target)
            count += 1
        return count


def _entry(line: bytes) -> Entry:
    try:
        d = json.loads(line)
        kind = {"f": "file", "b": "blob"}[d["t"]]
        path = d["path"] if kind == "file" else d["name"]
        return Entry(kind, path, int(d.get("mode", 0)), int(d["size"]), tuple(d["chunks"]))
    except (ValueError, KeyError, TypeError) as e:
        raise BackupError("a snapshot's file list is damaged", hint="run a verify") from e
