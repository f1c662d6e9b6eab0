"""The backup repository's cryptography (see docs/backup-format.md).

* The repository *master* (32 random bytes) is the writer's secret: chunk names
  (HMAC-SHA256 under the dedup key) and the index/snapshot envelope key are
  derived from it with HKDF.  The config keeps it sealed to the owner.
* Data never depends on the master: each backup run seals a fresh 32-byte data
  key to the owner's public key (one HPKE call) and encrypts its blobs with
  AES-256-GCM under it, so a writer holding only the owner's public key and the
  master can write data but never read any.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from lnk.errors import BackupError
from lnk.formats import keys

NONCE_LEN = 12
KEY_LEN = 32


def hkdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_LEN, salt=None, info=info).derive(secret)


def keyed_id(key: bytes, data: bytes) -> bytes:
    """HMAC-SHA256 of ``data`` under ``key``: a name that reveals nothing."""
    return hmac.new(key, data, hashlib.sha256).digest()


def seal_to(public: keys.PublicKey, plaintext: bytes, info: bytes) -> bytes:
    """HPKE-seal ``plaintext`` to ``public`` (the suite of lnk.formats.keys)."""
    fn = getattr(keys, "hpke_seal", None)
    if fn is not None:
        return bytes(fn(public, plaintext, info))
    return bytes(keys.SUITE.encrypt(plaintext, public.hpke_key, info))


def open_with(receiver: keys.ReceiverKey, ciphertext: bytes, info: bytes) -> bytes:
    """Open what :func:`seal_to` sealed; BackupError if the key is wrong."""
    fn = getattr(keys, "hpke_open", None)
    try:
        if fn is not None:
            return bytes(fn(receiver, ciphertext, info))
        return bytes(keys.SUITE.decrypt(ciphertext, receiver.hpke_private, info))
    except BackupError:
        raise
    except Exception as e:
        raise BackupError(
            "this key cannot open the backup repository's sealed keys",
            hint="use the owner's backup key the repository was made for",
        ) from e


def encrypt(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM with a random nonce: ``nonce ‖ ciphertext ‖ tag``."""
    return encrypt_with(AESGCM(key), plaintext, aad)


def aead(key: bytes) -> AESGCM:
    """An AES-256-GCM context for many :func:`encrypt_with` calls under one key."""
    return AESGCM(key)


def encrypt_with(ctx: AESGCM, plaintext: bytes, aad: bytes) -> bytes:
    """:func:`encrypt` with a context made once (a run seals many small blobs)."""
    nonce = os.urandom(NONCE_LEN)
    return nonce + ctx.encrypt(nonce, plaintext, aad)


def decrypt(key: bytes, blob: bytes, aad: bytes, what: str) -> bytes:
    return decrypt_with(AESGCM(key), blob, aad, what)


def decrypt_with(ctx: AESGCM, blob: bytes, aad: bytes, what: str) -> bytes:
    """:func:`decrypt` with a context made once."""
    if len(blob) < NONCE_LEN + 16:
        raise BackupError(f"{what} is truncated", hint="run a verify; the object is damaged")
    try:
        return ctx.decrypt(blob[:NONCE_LEN], blob[NONCE_LEN:], aad)
    except InvalidTag as e:
        raise BackupError(
            f"{what} does not authenticate: it is damaged, or the key is not this repository's",
            hint="run a verify, and check that you use this repository's key",
        ) from e
