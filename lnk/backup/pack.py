"""The pack format's names and bindings: what a writer and a reader of packs share.

A pack is ``PACK_MAGIC`` followed by sealed blobs; each blob's AEAD binds the
repository, the blob's kind and its keyed ID (``blob_aad``); a run's data key is
derived with ``run_info``.  See docs/backup-format.md.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import secrets
from typing import Any, Protocol

import zstandard

from lnk.backup import crypto

PACK_MAGIC = b"LNKPACK1"


class _HasId(Protocol):
    @property
    def id_bytes(self) -> bytes: ...


def pack_key(name: str) -> str:
    """The object key of pack ``name`` under the repository's prefix."""
    return f"data/{name[:2]}/{name}"


def new_name() -> str:
    """A fresh random name for a pack or a run."""
    return secrets.token_hex(16)


def run_info(repo: _HasId, run_id: bytes) -> bytes:
    return b"lnk-backup run " + repo.id_bytes + run_id


def blob_aad(repo: _HasId, kind: str, blob_id: bytes) -> bytes:
    return aad_of(repo.id_bytes, kind, blob_id)


def aad_of(repo_id: bytes, kind: str, blob_id: bytes) -> bytes:
    return b"lnk-backup/blob/" + repo_id + b"/" + kind.encode() + b"/" + blob_id


def blob_name(dedup_key: bytes, kind: str, data: bytes) -> bytes:
    """A blob's ID: HMAC-SHA256 under the repository's dedup key of ``kind ‖ 0x00 ‖ data``."""
    h = hmac.new(dedup_key, kind.encode() + b"\0", hashlib.sha256)
    h.update(data)
    return h.digest()


def seal_blob(
    ctx: Any, cctx: zstandard.ZstdCompressor, repo_id: bytes, kind: str, blob_id: bytes, data: bytes
) -> bytes:
    """A blob as stored: ``0x01 ‖ zstd(data)`` (or ``0x00 ‖ data`` when that is not
    smaller), sealed under the run's AES-GCM context ``ctx``."""
    packed = cctx.compress(data)
    plain = b"\x01" + packed if len(packed) < len(data) else b"\x00" + data
    return crypto.encrypt_with(ctx, plain, aad_of(repo_id, kind, blob_id))


def pin_mmap_threshold() -> None:
    """Keep glibc from moving its mmap threshold up to our pack-sized buffers: once it
    has, every freed 16 MiB pack and 1 MiB batch stays in a fragmented heap (the RSS
    of a 20,000-file backup doubled, 100 -> 200+ MiB).  M_MMAP_THRESHOLD = 128 KiB, as
    glibc starts; a no-op elsewhere."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass
