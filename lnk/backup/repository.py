"""A backup repository in a bucket: content-addressed, sealed to its owner.

Objects (all under the bucket URL's prefix)::

    config                    plaintext JSON: format, id, owner's public key,
                              the master sealed to the owner, a check value
    data/<xx>/<name>          packs of encrypted blobs (a few MiB each)
    index/<name>              which blobs pack <name> holds (index key)
    snapshots/<id>            one per finished backup: the commit (index key)
    locks/<run>               an in-progress backup (plaintext, tiny)
    damaged/<name>            pack <name> failed a verify (index key): its blobs
                              are stored again by the next backup or repair

See docs/backup-format.md for the byte layouts and the commit order.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import secrets
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import zstandard

from lnk.backup import crypto
from lnk.backup.blobindex import BlobIndex, BlobRef, IndexBuilder
from lnk.errors import AlreadyExists, BackupError, FormatMismatch, NotFound, Refused
from lnk.formats.keys import PublicKey, ReceiverKey, parse_public_key
from lnk.transport.buckets import Bucket

FORMAT = "lnk-backup"
VERSION = 1
CHUNK_SIZE = 1024 * 1024
PACK_SIZE = 16 * 1024 * 1024
# what a config may say (it is plaintext in the bucket, not authenticated): a chunk is
# read whole and sent to the sealing process with a u32 length, a pack is held whole
SIZES = {"chunk_size": (64 << 10, 16 << 20), "pack_size": (1 << 20, 256 << 20)}
ENVELOPE_MAGIC = b"LNKBKE1\n"
FETCHERS = 8  # concurrent GETs of small objects (indexes, snapshots)
INDEX_SLICE = 8  # index documents fetched and held at once (at 32, memray found about
# 35 MiB of decoded documents left in the allocator's arenas at a million blobs)


@dataclass(frozen=True)
class SnapshotInfo:
    id: str
    time: datetime
    meta: dict[str, Any]
    packs: tuple[str, ...] = field(repr=False)
    tree: tuple[str, ...] = field(repr=False)
    files: int = 0
    bytes: int = 0


class Repository:
    """A handle on one repository.

    ``master`` (the writer secret) lets it write, list, verify and prune;
    ``receiver`` (the owner's private key) also lets it read data.  A handle
    with neither can only say who owns the repository.
    """

    def __init__(
        self,
        bucket: Bucket,
        config: dict[str, Any],
        master: bytes | None,
        receiver: ReceiverKey | None,
    ) -> None:
        self.bucket = bucket
        self.config = config
        self.id = str(config["id"])
        self.id_bytes = bytes.fromhex(self.id)
        self.owner: PublicKey = parse_public_key(config["owner"])
        self.chunk_size = int(config.get("chunk_size", CHUNK_SIZE))
        self.pack_size = int(config.get("pack_size", PACK_SIZE))
        self.receiver = receiver
        self._master = master
        if master is not None:
            self.dedup_key = crypto.hkdf(master, b"lnk-backup dedup " + self.id_bytes)
            self.index_key = crypto.hkdf(master, b"lnk-backup index " + self.id_bytes)

    # ---- making and opening -------------------------------------------------

    @classmethod
    def init(
        cls,
        bucket: Bucket,
        owner_public: PublicKey | str,
        *,
        chunk_size: int = CHUNK_SIZE,
        pack_size: int = PACK_SIZE,
    ) -> Repository:
        """Make a new repository in ``bucket``, sealed to ``owner_public``.

        The returned handle can write; keep its :attr:`writer_secret` where
        the machines that back up can read it (the owner can always recover
        it from the config with the private key)."""
        owner = parse_public_key(owner_public) if isinstance(owner_public, str) else owner_public
        if bucket.exists("config"):
            raise AlreadyExists(
                f"{bucket.describe()} already holds a backup repository",
                hint="open it instead, or choose another bucket prefix",
            )
        repo_id = secrets.token_hex(16)
        master = os.urandom(crypto.KEY_LEN)
        config = {
            "format": FORMAT,
            "version": VERSION,
            "id": repo_id,
            "owner": owner.text(),
            "chunk_size": chunk_size,
            "pack_size": pack_size,
            "sealed_master": base64.b64encode(
                crypto.seal_to(owner, master, _master_info(repo_id))
            ).decode(),
            "master_check": _master_check(master, repo_id),
        }
        bucket.put("config", json.dumps(config, indent=1).encode() + b"\n")
        return cls(bucket, config, master, None)

    @classmethod
    def open(
        cls,
        bucket: Bucket,
        *,
        writer_secret: bytes | None = None,
        receiver_key: ReceiverKey | None = None,
    ) -> Repository:
        """Open the repository in ``bucket`` (reads its config, once).

        With ``receiver_key`` (the owner's) the handle reads and writes; with
        only ``writer_secret`` it writes but cannot read data."""
        return cls(bucket, cls.read_config(bucket), None, None).unlock(
            writer_secret=writer_secret, receiver_key=receiver_key
        )

    @staticmethod
    def read_config(bucket: Bucket) -> dict[str, Any]:
        """The repository's plaintext config, checked for format and version."""
        try:
            raw = bucket.get("config")
        except NotFound:
            raise NotFound(
                f"no backup repository in {bucket.describe()}",
                hint="check the URL, or make one first",
            ) from None
        try:
            config = json.loads(raw)
        except ValueError:
            raise BackupError(f"the config of {bucket.describe()} is not JSON") from None
        if config.get("format") != FORMAT:
            raise FormatMismatch(f"{bucket.describe()} is not an lnk backup repository")
        if config.get("version") != VERSION:
            raise FormatMismatch(
                f"{bucket.describe()} is backup format {config.get('version')}, "
                f"this lnk reads {VERSION}",
                hint="upgrade lnk",
            )
        if not isinstance(config.get("id"), str) or "owner" not in config:
            raise BackupError(f"the config of {bucket.describe()} is damaged")
        for key, (low, high) in SIZES.items():
            size = config.get(key)
            if key in config and (
                not isinstance(size, int) or isinstance(size, bool) or not low <= size <= high
            ):
                raise BackupError(
                    f"the config of {bucket.describe()} is damaged: its {key} is not a "
                    f"whole number from {low} to {high}",
                    hint="the bucket's config was changed by someone other than lnk",
                )
        return dict(config)

    def unlock(
        self, *, writer_secret: bytes | None = None, receiver_key: ReceiverKey | None = None
    ) -> Repository:
        """A handle on the same repository (its config is not read again) with a key:
        ``receiver_key`` (the owner's) reads and writes, ``writer_secret`` writes."""
        bucket, config = self.bucket, self.config
        repo_id = self.id
        master = writer_secret
        if receiver_key is not None:
            if receiver_key.public.raw != self.owner.raw:
                raise Refused(
                    f"this key is not the owner's key of {bucket.describe()}",
                    hint="use the backup key the repository was made for",
                )
            sealed = base64.b64decode(config["sealed_master"])
            master = crypto.open_with(receiver_key, sealed, _master_info(repo_id))
        if master is not None and not hmac.compare_digest(
            _master_check(master, repo_id), str(config.get("master_check", ""))
        ):
            raise Refused(
                f"the writer secret does not belong to {bucket.describe()}",
                hint="use the secret saved when this repository was made",
            )
        return Repository(bucket, config, master, receiver_key)

    @property
    def writer_secret(self) -> bytes:
        return self.master

    @property
    def master(self) -> bytes:
        if self._master is None:
            raise Refused(
                f"this handle on {self.bucket.describe()} holds no key",
                hint="open the repository with its writer secret or the owner's key",
            )
        return self._master

    @property
    def can_read(self) -> bool:
        return self.receiver is not None

    # ---- envelopes for index and snapshot objects ---------------------------

    def seal_object(self, key: str, doc: dict[str, Any]) -> bytes:
        plain = zstandard.ZstdCompressor(level=3).compress(json.dumps(doc).encode())
        aad = b"lnk-backup/" + self.id_bytes + b"/" + key.encode()
        _ = self.master
        return ENVELOPE_MAGIC + crypto.encrypt(self.index_key, plain, aad)

    def open_object(self, key: str, data: bytes) -> dict[str, Any]:
        _ = self.master
        what = f"{key} in {self.bucket.describe()}"
        if not data.startswith(ENVELOPE_MAGIC):
            raise BackupError(f"{what} is not a backup object", hint="run a verify")
        aad = b"lnk-backup/" + self.id_bytes + b"/" + key.encode()
        plain = crypto.decrypt(self.index_key, data[len(ENVELOPE_MAGIC) :], aad, what)
        try:
            doc = json.loads(zstandard.ZstdDecompressor().decompress(plain))
        except (ValueError, zstandard.ZstdError) as e:
            raise BackupError(f"{what} is damaged", hint="run a verify") from e
        if not isinstance(doc, dict):
            raise BackupError(f"{what} is damaged", hint="run a verify")
        return doc

    def read_object(self, key: str) -> dict[str, Any]:
        return self.open_object(key, self.bucket.get(key))

    # ---- indexes and snapshots ----------------------------------------------

    def read_index(self, pack: str) -> dict[str, Any]:
        return self.read_object(f"index/{pack}")

    def index_names(self) -> list[str]:
        return [k.split("/", 1)[1] for k, _ in self.bucket.list("index/")]

    def read_indexes(
        self, packs: Iterable[str] | None = None, *, missing_ok: bool = False
    ) -> dict[str, dict[str, Any]]:
        """pack -> its index document, fetched concurrently (default: every index).
        With ``missing_ok`` an index that is gone is left out rather than an error."""
        return dict(self.iter_indexes(packs, missing_ok=missing_ok))

    def iter_indexes(
        self, packs: Iterable[str] | None = None, *, missing_ok: bool = False
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(pack, its index document), fetched concurrently a slice at a time: only a
        slice of documents is held at once, whatever the repository's size."""
        names = self.index_names() if packs is None else list(dict.fromkeys(packs))

        def one(pack: str) -> tuple[str, dict[str, Any] | None]:
            try:
                return pack, self.read_index(pack)
            except NotFound:
                if missing_ok:
                    return pack, None
                raise

        with ThreadPoolExecutor(FETCHERS, "lnk-backup-index") as pool:
            for at in range(0, len(names), INDEX_SLICE):
                for p, d in pool.map(one, names[at : at + INDEX_SLICE]):
                    if d is not None:
                        yield p, d

    def load_index(
        self,
        packs: Iterable[str] | None = None,
        *,
        skip_damaged: bool = False,
        missing_ok: bool = False,
    ) -> BlobIndex:
        """blob id -> where it is, for ``packs`` (default: every indexed pack), compact
        (:mod:`lnk.backup.blobindex`: about 54 bytes a blob).

        A blob stored twice maps to a copy in a pack no verify found damaged; with
        ``skip_damaged`` a blob whose every copy is in a damaged pack is left out, so
        a writer stores it again (that is how a repository heals)."""
        damaged = self.damaged_packs()
        found = IndexBuilder()
        for pack, doc in self.iter_indexes(packs, missing_ok=missing_ok):
            bad = pack in damaged
            if bad and skip_damaged:
                continue
            add_index_doc(found, pack, doc, bad)
        return found.build()

    def blob_copies(self) -> dict[bytes, list[BlobRef]]:
        """blob id -> every copy the indexes list, copies in undamaged packs first."""
        damaged = self.damaged_packs()
        out: dict[bytes, list[BlobRef]] = {}
        for pack, doc in self.iter_indexes(missing_ok=True):
            for blob_id, kind, offset, length in doc["blobs"]:
                out.setdefault(bytes.fromhex(blob_id), []).append(
                    BlobRef(pack, offset, length, kind)
                )
        for refs in out.values():
            refs.sort(key=lambda r: r.pack in damaged)
        return out

    # ---- damaged packs ------------------------------------------------------

    def damaged_packs(self) -> set[str]:
        """Packs a verify found damaged or missing (``damaged/<name>``)."""
        return {k.split("/", 1)[1] for k, _ in self.bucket.list("damaged/")}

    def mark_damaged(self, pack: str, reason: str) -> None:
        """Record that ``pack`` is damaged: the next writer stores its blobs again."""
        key = f"damaged/{pack}"
        doc = {"pack": pack, "reason": reason, "time": datetime.now(UTC).isoformat()}
        self.bucket.put(key, self.seal_object(key, doc))

    def snapshot(self, snapshot_id: str) -> SnapshotInfo:
        try:
            doc = self.read_object(f"snapshots/{snapshot_id}")
        except NotFound:
            raise NotFound(f"no snapshot {snapshot_id} in {self.bucket.describe()}") from None
        return _snapshot_info(doc)

    def list_snapshots(self) -> list[SnapshotInfo]:
        """Every committed snapshot, oldest first."""
        names = [k.split("/", 1)[1] for k, _ in self.bucket.list("snapshots/")]
        with ThreadPoolExecutor(FETCHERS, "lnk-backup-snap") as pool:
            out = list(pool.map(self.snapshot, names))
        return sorted(out, key=lambda s: (s.time, s.id))


def add_index_doc(found: IndexBuilder, pack: str, doc: dict[str, Any], damaged: bool) -> None:
    """Every blob of ``pack``'s index document into ``found``."""
    found.add_pack(
        pack,
        ((bytes.fromhex(b), kind, offset, length) for b, kind, offset, length in doc["blobs"]),
        damaged,
    )


def _master_info(repo_id: str) -> bytes:
    return b"lnk-backup master " + repo_id.encode()


def _master_check(master: bytes, repo_id: str) -> str:
    return crypto.keyed_id(master, b"lnk-backup check " + repo_id.encode())[:16].hex()


def _snapshot_info(doc: dict[str, Any]) -> SnapshotInfo:
    t = datetime.fromisoformat(doc["time"])
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return SnapshotInfo(
        id=doc["id"],
        time=t,
        meta=dict(doc.get("meta", {})),
        packs=tuple(doc.get("packs", [])),
        tree=tuple(doc.get("tree", [])),
        files=int(doc.get("files", 0)),
        bytes=int(doc.get("bytes", 0)),
    )
