"""The sealed stream's header, format 4 (docs/stream-format.md).

The constants of the fixed part, the fault every part of the format raises
(:class:`StreamFault`), and the building, reading and checking of the header
and its cleartext metadata.  ``records.py`` seals and opens the records that
follow it; ``stream.py`` and ``reader.py`` drive both over a file.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import IO, Any, BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke

from lnk.errors import FormatMismatch, InvalidInput, StreamError
from lnk.formats.keys import SUITE

MAGIC = b"\x89LNK\r\n\x1a\n"
FORMAT = 4
KEM_MLKEM768_X25519 = 0x647A
KDF_HKDF_SHA256 = 0x0001
AEAD_AES_256_GCM = 0x0002
REC_LOG2 = 20
REC_LOG2_MIN = 16
RECORD_MAX = 1 << REC_LOG2  # largest body of one record: 1 MiB
META_MAX = 4096
SEALED_LEN = 1120 + 32 + 16
HPKE_INFO = b"lnk/stream/4/hpke\x00"

_FIXED = struct.Struct(">8sHHHHHBB16s32sH")  # through meta_len: 70 bytes
FIXED_LEN = _FIXED.size


class StreamFault(StreamError):
    """A stream refused for a reason a caller may branch on.

    ``kind`` is one of: ``not-lnk``, ``unsupported``, ``wrong-key``, ``header``,
    ``payload``, ``truncated``, ``trailing``.  (A stream of another format
    number raises :class:`lnk.errors.FormatMismatch` instead.)
    """

    def __init__(self, kind: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.kind = kind


DAMAGED = "the stream was altered or damaged on the way; send it again"


def read_exact(inp: IO[bytes], n: int) -> bytes:
    """Read exactly n bytes, or fewer only at end of input."""
    first = inp.read(n)
    if first is None or len(first) == n:
        return first or b""
    parts = [first]
    got = len(first)
    while got < n:
        chunk = inp.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def canonical_meta(meta: dict[str, Any]) -> bytes:
    if not isinstance(meta, dict):
        raise InvalidInput("stream metadata must be a JSON object (a dict)")
    data = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(data) > META_MAX:
        raise InvalidInput(
            f"stream metadata is {len(data)} bytes encoded; the limit is {META_MAX}",
            hint="keep large things in records, not in the cleartext metadata",
        )
    return data


def describe_prefix(data: bytes) -> str:
    """Say what some bytes that are not an lnk stream look like."""
    known = {
        b"age-encryption.org/": "an age-encrypted file",
        b"\x28\xb5\x2f\xfd": "a zstd file",
        b"\x1f\x8b": "a gzip file",
        b"PK\x03\x04": "a zip file",
        b"SSH-": "an SSH banner (the remote end did not run lnk)",
    }
    for magic, what in known.items():
        if data.startswith(magic):
            return f"they look like {what}"
    shown = data[:16]
    text = shown.decode("ascii", "replace")
    if all(32 <= b < 127 or b in (9, 10, 13) for b in shown):
        return f"they are text: {text!r}"
    return f"they are {shown.hex(' ')}"


def check_prelude(prelude: bytes) -> int:
    """Check the first 10 bytes (magic, format); return the format or raise."""
    if not prelude:
        raise StreamFault("truncated", "the stream is empty", hint=DAMAGED)
    if not MAGIC.startswith(prelude[:8]):
        raise StreamFault(
            "not-lnk",
            f"not an lnk stream: the first bytes are not lnk's ({describe_prefix(prelude)})",
            hint="check that both ends run lnk and that nothing else writes to the stream",
        )
    if len(prelude) < 10:
        raise StreamFault("truncated", "the stream ends inside its header", hint=DAMAGED)
    (fmt,) = struct.unpack(">H", prelude[8:10])
    if fmt != FORMAT:
        older = "the receiving end" if fmt > FORMAT else "the sending end"
        raise FormatMismatch(
            f"this stream is lnk format {fmt}; this lnk reads format {FORMAT}",
            hint=f"upgrade lnk on the older end ({older}) so both use the same format",
        )
    return int(fmt)


@dataclass(frozen=True)
class Header:
    raw: bytes  # the whole header
    hh: bytes  # SHA-256 of raw
    stream_id: bytes
    key_id: bytes
    rec_log2: int
    meta_bytes: bytes

    @property
    def record_max(self) -> int:
        return 1 << self.rec_log2


def build_header(
    public_raw: bytes,
    hpke_public: hpke.MLKEM768X25519PublicKey,
    meta_bytes: bytes,
    stream_id: bytes,
    stream_key: bytes,
) -> Header:
    kid = hashlib.sha256(public_raw).digest()
    fixed = _FIXED.pack(
        MAGIC,
        FORMAT,
        KEM_MLKEM768_X25519,
        KDF_HKDF_SHA256,
        AEAD_AES_256_GCM,
        AEAD_AES_256_GCM,
        REC_LOG2,
        0,
        stream_id,
        kid,
        len(meta_bytes),
    )
    prefix = fixed + meta_bytes + struct.pack(">H", SEALED_LEN)
    info = HPKE_INFO + hashlib.sha256(prefix).digest()
    sealed = SUITE.encrypt(stream_key, hpke_public, info=info)
    assert len(sealed) == SEALED_LEN
    raw = prefix + sealed
    return Header(raw, hashlib.sha256(raw).digest(), stream_id, kid, REC_LOG2, meta_bytes)


def read_header(
    inp: BinaryIO, private: hpke.MLKEM768X25519PrivateKey, my_key_id: bytes
) -> tuple[Header, bytes]:
    """Read and verify a header; return it and the stream key K."""
    prelude = read_exact(inp, 10)
    check_prelude(prelude)
    rest = read_exact(inp, FIXED_LEN - 10)
    if len(rest) < FIXED_LEN - 10:
        raise StreamFault("truncated", "the stream ends inside its header", hint=DAMAGED)
    fixed = prelude + rest
    (_m, _f, kem, kdf, haead, paead, rec_log2, reserved, stream_id, kid, meta_len) = _FIXED.unpack(
        fixed
    )
    suite = (kem, kdf, haead, paead)
    if suite != (KEM_MLKEM768_X25519, KDF_HKDF_SHA256, AEAD_AES_256_GCM, AEAD_AES_256_GCM):
        raise StreamFault(
            "unsupported",
            "the stream uses a cipher suite this lnk does not know "
            f"(kem {kem:#06x}, kdf {kdf:#06x}, aead {haead:#06x}/{paead:#06x})",
            hint="the header was damaged, or the other end is not a compatible lnk",
        )
    if not REC_LOG2_MIN <= rec_log2 <= REC_LOG2 or reserved != 0:
        raise StreamFault(
            "unsupported",
            f"the stream's record size 2^{rec_log2} (flags {reserved:#04x}) is outside "
            f"what this lnk reads (2^{REC_LOG2_MIN} to 2^{REC_LOG2}, no flags)",
            hint=DAMAGED,
        )
    if kid != my_key_id:
        raise StreamFault(
            "wrong-key",
            f"this stream was sealed to another receiver (key id {kid.hex()[:16]}…; "
            f"this receiver's is {my_key_id.hex()[:16]}…)",
            hint="give the sender this receiver's public key, or read the stream "
            "with the receiver it was made for",
        )
    if meta_len > META_MAX:
        raise StreamFault(
            "header",
            f"the stream header declares {meta_len} bytes of metadata; the limit is {META_MAX}",
            hint=DAMAGED,
        )
    meta_bytes = read_exact(inp, meta_len)
    slen_b = read_exact(inp, 2)
    if len(meta_bytes) < meta_len or len(slen_b) < 2:
        raise StreamFault("truncated", "the stream ends inside its header", hint=DAMAGED)
    (slen,) = struct.unpack(">H", slen_b)
    if slen != SEALED_LEN:
        raise StreamFault(
            "header",
            f"the stream header's sealed key is {slen} bytes, not {SEALED_LEN}",
            hint=DAMAGED,
        )
    sealed = read_exact(inp, slen)
    if len(sealed) < slen:
        raise StreamFault("truncated", "the stream ends inside its header", hint=DAMAGED)
    prefix = fixed + meta_bytes + slen_b
    info = HPKE_INFO + hashlib.sha256(prefix).digest()
    try:
        stream_key = SUITE.decrypt(sealed, private, info=info)
    except (InvalidTag, ValueError):
        raise StreamFault(
            "header",
            "the stream header does not verify: it was altered or damaged",
            hint=DAMAGED,
        ) from None
    if len(stream_key) != 32:
        raise StreamFault("header", "the stream key is not 32 bytes", hint=DAMAGED)
    raw = prefix + sealed
    return Header(
        raw, hashlib.sha256(raw).digest(), stream_id, kid, rec_log2, meta_bytes
    ), stream_key


def parse_meta(meta_bytes: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(meta_bytes.decode("utf-8")) if meta_bytes else {}
    except (UnicodeDecodeError, ValueError, RecursionError):
        meta = None
    if not isinstance(meta, dict):
        raise StreamFault("header", "the stream's metadata is not a JSON object", hint=DAMAGED)
    return meta
