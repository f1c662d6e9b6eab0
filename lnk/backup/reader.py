"""Reading one snapshot back: entries, files, blobs, a whole restore.

Needs the owner's private key: every data key is sealed to it.  Memory stays
bounded: one pack (a few MiB) is cached at a time and files are streamed chunk
by chunk.
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

READ_AHEAD = 64  # chunks whose packs are fetched ahead of the one being written
PACKS_AHEAD = 2  # packs held at once by a read-ahead (each <= pack size); 3 and 4
# fetchers with 3 packs were no faster and held 17 MiB more (100,000 files)
FETCHERS = 2  # concurrent pack downloads, each holding a whole pack while it lands; a
# million-file restore peaked at 209 MiB with 2 and 200 MiB with 3: no gain beyond a
# run's variance (bench/README), kept as the smaller bound


@dataclass(frozen=True)
class Entry:
    """A file (``kind == "file"``) or a named blob (``kind == "blob"``)."""

    kind: str
    path: str
    mode: int
    size: int
    chunks: tuple[str, ...]


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
        self._local = threading.local()  # a zstd decompressor per thread
        self._pack_name: str | None = None
        self._pack: bytes = b""

    # ---- blobs --------------------------------------------------------------

    def _load_pack(self, name: str) -> bytes:
        if self._pack_name != name:
            self._pack = self.repo.bucket.get(pack_key(name))
            self._pack_name = name
        return self._pack

    def _run_aead(self, pack: bytes, name: str) -> Any:
        """The AES-GCM context of the data key sealed in ``pack``'s header (opened once
        per run)."""
        head = len(PACK_MAGIC)
        if not pack.startswith(PACK_MAGIC) or len(pack) < head + 18:
            raise BackupError(f"pack {name} is damaged (no header)", hint="run a verify")
        run_id = pack[head : head + 16]
        ctx = self._runs.get(run_id)
        if ctx is None:
            (n,) = struct.unpack(">H", pack[head + 16 : head + 18])
            sealed = pack[head + 18 : head + 18 + n]
            key = crypto.open_with(self.key, sealed, run_info(self.repo, run_id))
            ctx = self._runs[run_id] = crypto.aead(key)
        return ctx

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
        """The plaintext of the blob ``blob_id`` stored at ``ref`` (authenticated)."""
        return self._open_in(self._load_pack(ref.pack), ref, blob_id)

    def _open_in(self, pack: bytes, ref: BlobRef, blob_id: bytes) -> bytes:
        """Open the blob at ``ref`` in the bytes of its ``pack`` (thread-safe)."""
        ctx = self._run_aead(pack, ref.pack)
        sealed = pack[ref.offset : ref.offset + ref.length]
        plain = crypto.decrypt_with(
            ctx, sealed, blob_aad(self.repo, ref.kind, blob_id), f"a blob of pack {ref.pack}"
        )
        if plain[:1] == b"\x01":
            dctx = getattr(self._local, "dctx", None)
            if dctx is None:
                dctx = self._local.dctx = zstandard.ZstdDecompressor()
            return dctx.decompress(plain[1:])
        return plain[1:]

    # ---- entries ------------------------------------------------------------

    def entries(self) -> Iterator[Entry]:
        """Every entry, in the order it was added."""
        carry = b""
        for blob_hex in self.info.tree:
            carry += self.chunk(blob_hex, "tree")
            *lines, carry = carry.split(b"\n")
            for line in lines:
                yield _entry(line)
        if carry.strip():
            yield _entry(carry)

    def open(self, entry: Entry) -> Iterator[bytes]:
        """The entry's content, chunk by chunk."""
        for blob_hex in entry.chunks:
            yield self.chunk(blob_hex)

    def read_ahead(
        self, entries: Iterator[Entry], window: int = READ_AHEAD
    ) -> Generator[tuple[Entry, Iterator[bytes]], None, None]:
        """Each entry with its content, in order, while the packs of the next
        ``window`` chunks are fetched (concurrently, each pack once; blobs are
        opened on this thread: a hand-off per small blob costs more than it saves).  A blob that fails there is read again through
        :meth:`chunk` (which looks for other copies).  Consume each entry's content
        before asking for the next entry."""
        pin_mmap_threshold()
        ahead, here = itertools.tee(entries)
        todo = (c for e in ahead for c in e.chunks)
        fetch = ThreadPoolExecutor(FETCHERS, "lnk-restore-fetch")
        packs: OrderedDict[str, Future[bytes]] = OrderedDict()
        pending: deque[tuple[str, BlobRef | None, Future[bytes] | None]] = deque()

        def pack(name: str) -> Future[bytes]:
            fut = packs.get(name)
            if fut is None:
                fut = packs[name] = fetch.submit(self.repo.bucket.get, pack_key(name))
                while len(packs) > PACKS_AHEAD:
                    packs.popitem(last=False)
            else:
                packs.move_to_end(name)
            return fut

        def fill() -> None:
            while len(pending) < window:
                blob_hex = next(todo, None)
                if blob_hex is None:
                    return
                ref = self.index.get(bytes.fromhex(blob_hex))
                if ref is None or ref.kind != "data":
                    pending.append((blob_hex, None, None))
                else:
                    pending.append((blob_hex, ref, pack(ref.pack)))

        def take() -> bytes:
            fill()
            blob_hex, ref, body = pending.popleft()
            if ref is not None and body is not None:
                try:
                    return self._open_in(body.result(), ref, bytes.fromhex(blob_hex))
                except (BackupError, NotFound):
                    pass
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
            for _h, _r, f in pending:
                if f is not None:
                    f.cancel()
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
