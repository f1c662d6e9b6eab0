"""Receiver key pairs for a sealed stream (see docs/stream-format.md, section 2).

A receiver key is an HPKE MLKEM768-X25519 ("X-Wing") key pair, stored as a
32-byte seed.  The hybrid key has no serialization of its own, so the seed is
expanded with SHAKE256 to 96 bytes: 64 for the ML-KEM-768 seed and 32 for the
X25519 private key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric import mlkem, x25519

from lnk.errors import InvalidInput, StreamError

SEED_LEN = 32
MLKEM_PUBLIC_LEN = 1184
X25519_PUBLIC_LEN = 32
PUBLIC_LEN = MLKEM_PUBLIC_LEN + X25519_PUBLIC_LEN  # 1216
PUBLIC_TEXT_PREFIX = "lnkpk1"
_CHECK_LEN = 4
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_TEXT_LEN = len(PUBLIC_TEXT_PREFIX) + (4 * (PUBLIC_LEN + _CHECK_LEN) + 2) // 3

SUITE = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)

__all__ = [
    "PUBLIC_LEN",
    "PUBLIC_TEXT_PREFIX",
    "SEED_LEN",
    "SUITE",
    "PublicKey",
    "ReceiverKey",
    "hpke_open",
    "hpke_seal",
    "key_id",
    "parse_public_key",
]


@dataclass(frozen=True)
class PublicKey:
    """A receiver's public key: 1216 bytes (ML-KEM-768 key ‖ X25519 key)."""

    raw: bytes
    hpke_key: hpke.MLKEM768X25519PublicKey = field(repr=False, compare=False)

    @classmethod
    def from_bytes(cls, raw: bytes) -> PublicKey:
        if len(raw) != PUBLIC_LEN:
            raise InvalidInput(
                f"a receiver public key is {PUBLIC_LEN} bytes, not {len(raw)}",
                hint="copy the whole key the receiver printed",
            )
        try:
            mk = mlkem.MLKEM768PublicKey.from_public_bytes(raw[:MLKEM_PUBLIC_LEN])
            xk = x25519.X25519PublicKey.from_public_bytes(raw[MLKEM_PUBLIC_LEN:])
        except ValueError as exc:
            raise InvalidInput(
                f"not a valid receiver public key ({exc})",
                hint="copy the whole key the receiver printed",
            ) from None
        return cls(bytes(raw), hpke.MLKEM768X25519PublicKey(mk, xk))

    @property
    def key_id(self) -> bytes:
        return key_id(self)

    def text(self) -> str:
        """The command-line form: ``lnkpk1`` + base64url(key ‖ 4-byte checksum)."""
        check = _checksum(self.raw)
        return PUBLIC_TEXT_PREFIX + base64.urlsafe_b64encode(self.raw + check).decode().rstrip("=")

    def __str__(self) -> str:
        return self.text()


class ReceiverKey:
    """A receiver's key pair for one switch, kept as its 32-byte seed."""

    __slots__ = ("_private", "_public", "_seed")

    def __init__(self, seed: bytes) -> None:
        if len(seed) != SEED_LEN:
            raise InvalidInput(
                f"a receiver key seed is {SEED_LEN} bytes, not {len(seed)}",
                hint="the receiver's key file is damaged; make a new receiver",
            )
        self._seed = bytes(seed)
        expanded = hashlib.shake_256(self._seed).digest(96)
        mk = mlkem.MLKEM768PrivateKey.from_seed_bytes(expanded[:64])
        xk = x25519.X25519PrivateKey.from_private_bytes(expanded[64:])
        self._private = hpke.MLKEM768X25519PrivateKey(mk, xk)
        raw = mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw()
        self._public = PublicKey(raw, self._private.public_key())

    @classmethod
    def generate(cls) -> ReceiverKey:
        return cls(os.urandom(SEED_LEN))

    @classmethod
    def from_seed(cls, seed: bytes) -> ReceiverKey:
        return cls(seed)

    @property
    def seed(self) -> bytes:
        return self._seed

    @property
    def public(self) -> PublicKey:
        return self._public

    @property
    def key_id(self) -> bytes:
        return key_id(self._public)

    @property
    def hpke_private(self) -> hpke.MLKEM768X25519PrivateKey:
        return self._private

    def public_key_text(self) -> str:
        return self._public.text()

    def __repr__(self) -> str:
        return f"ReceiverKey(key_id={self.key_id.hex()[:16]}…)"


def key_id(public: PublicKey) -> bytes:
    """SHA-256 of the public key bytes (32 bytes)."""
    return hashlib.sha256(public.raw).digest()


def hpke_seal(public: PublicKey, plaintext: bytes, info: bytes) -> bytes:
    """HPKE single-shot Seal (Base mode) to ``public``: ``enc ‖ ciphertext``."""
    return SUITE.encrypt(plaintext, public.hpke_key, info=info)


def hpke_open(receiver: ReceiverKey, sealed: bytes, info: bytes) -> bytes:
    """Open what :func:`hpke_seal` sealed; StreamError if key or info differ."""
    try:
        return SUITE.decrypt(sealed, receiver.hpke_private, info=info)
    except (InvalidTag, ValueError):
        raise StreamError(
            "a sealed message does not open with this key: it was sealed to another "
            "key, or altered",
            hint="use the key it was sealed to",
        ) from None


def _checksum(raw: bytes) -> bytes:
    return hashlib.sha256(PUBLIC_TEXT_PREFIX.encode() + raw).digest()[:_CHECK_LEN]


def parse_public_key(text: str) -> PublicKey:
    """Parse the ``lnkpk1…`` text form; raise InvalidInput on anything else."""
    hint = "copy the whole key the receiver printed (it starts with lnkpk1 and is one line)"
    t = "".join(text.split())
    if not t.startswith(PUBLIC_TEXT_PREFIX):
        shown = t[:12] + ("…" if len(t) > 12 else "")
        raise InvalidInput(
            f"not an lnk receiver public key: it should start with {PUBLIC_TEXT_PREFIX}, "
            f"not {shown!r}",
            hint=hint,
        )
    if len(t) != _TEXT_LEN:
        raise InvalidInput(
            f"the receiver public key has the wrong length ({len(t)} characters, "
            f"expected {_TEXT_LEN}): it was probably cut off or pasted twice",
            hint=hint,
        )
    body = t[len(PUBLIC_TEXT_PREFIX) :]
    if not _B64URL.fullmatch(body):
        raise InvalidInput(
            "the receiver public key has characters that are not base64url", hint=hint
        )
    data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    if base64.urlsafe_b64encode(data).decode().rstrip("=") != body:
        data = b""  # unused bits set in the last character: a typo there
    raw, check = data[:PUBLIC_LEN], data[PUBLIC_LEN:]
    if len(data) != PUBLIC_LEN + _CHECK_LEN or not hmac.compare_digest(check, _checksum(raw)):
        raise InvalidInput(
            "the receiver public key's checksum does not match: it has a typo", hint=hint
        )
    return PublicKey.from_bytes(raw)
