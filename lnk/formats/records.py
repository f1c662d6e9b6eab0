"""Byte layout of the sealed stream, format 4 (docs/stream-format.md).

This module holds the pure, stateless pieces: constants, the header, and the
sealing and opening of one record.  ``stream.py`` drives them over a file.
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, hpke
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

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
TAG_LEN = 16
RECORD_OVERHEAD = 2 + TAG_LEN  # rtype + codec + tag
FINAL_BIT = 0x8000_0000
RTYPE_FINAL = 0x7F
CODEC_RAW = 0
CODEC_ZSTD = 1
FINAL_BODY_LEN = 48
EPOCH_SHIFT = 16
MAX_RECORDS = 1 << 48
HPKE_INFO = b"lnk/stream/4/hpke\x00"
PAYLOAD_INFO = b"lnk/stream/4/payload\x00"

_FIXED = struct.Struct(">8sHHHHHBB16s32sH")  # through meta_len: 70 bytes
FIXED_LEN = _FIXED.size
_WORD = struct.Struct(">I")
_FINAL = struct.Struct(">QQ32s")


class StreamFault(StreamError):
    """A stream refused for a reason a caller may branch on.

    ``kind`` is one of: ``not-lnk``, ``unsupported``, ``wrong-key``, ``header``,
    ``payload``, ``truncated``, ``trailing``.  (A stream of another format
    number raises :class:`lnk.errors.FormatMismatch` instead.)
    """

    def __init__(self, kind: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.kind = kind


_DAMAGED = "the stream was altered or damaged on the way; send it again"


def read_exact(inp: BinaryIO, n: int) -> bytes:
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
        raise StreamFault("truncated", "the stream is empty", hint=_DAMAGED)
    if not MAGIC.startswith(prelude[:8]):
        raise StreamFault(
            "not-lnk",
            f"not an lnk stream: the first bytes are not lnk's ({describe_prefix(prelude)})",
            hint="check that both ends run lnk and that nothing else writes to the stream",
        )
    if len(prelude) < 10:
        raise StreamFault("truncated", "the stream ends inside its header", hint=_DAMAGED)
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
        raise StreamFault("truncated", "the stream ends inside its header", hint=_DAMAGED)
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
            hint=_DAMAGED,
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
            hint=_DAMAGED,
        )
    meta_bytes = read_exact(inp, meta_len)
    slen_b = read_exact(inp, 2)
    if len(meta_bytes) < meta_len or len(slen_b) < 2:
        raise StreamFault("truncated", "the stream ends inside its header", hint=_DAMAGED)
    (slen,) = struct.unpack(">H", slen_b)
    if slen != SEALED_LEN:
        raise StreamFault(
            "header",
            f"the stream header's sealed key is {slen} bytes, not {SEALED_LEN}",
            hint=_DAMAGED,
        )
    sealed = read_exact(inp, slen)
    if len(sealed) < slen:
        raise StreamFault("truncated", "the stream ends inside its header", hint=_DAMAGED)
    prefix = fixed + meta_bytes + slen_b
    info = HPKE_INFO + hashlib.sha256(prefix).digest()
    try:
        stream_key = SUITE.decrypt(sealed, private, info=info)
    except (InvalidTag, ValueError):
        raise StreamFault(
            "header",
            "the stream header does not verify: it was altered or damaged",
            hint=_DAMAGED,
        ) from None
    if len(stream_key) != 32:
        raise StreamFault("header", "the stream key is not 32 bytes", hint=_DAMAGED)
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
        raise StreamFault("header", "the stream's metadata is not a JSON object", hint=_DAMAGED)
    return meta


class Keys:
    """The per-epoch payload keys of one stream (thread-safe, cached)."""

    def __init__(self, stream_key: bytes, header: Header) -> None:
        self._k = stream_key
        self._header = header
        self._lock = threading.Lock()
        self._cache: dict[int, AESGCM] = {}

    @property
    def hh(self) -> bytes:
        return self._header.hh

    def aead(self, index: int) -> AESGCM:
        epoch = index >> EPOCH_SHIFT
        with self._lock:
            a = self._cache.get(epoch)
            if a is None:
                info = PAYLOAD_INFO + self._header.hh + struct.pack(">I", epoch)
                k = HKDF(hashes.SHA256(), 32, self._header.stream_id, info).derive(self._k)
                a = AESGCM(k)
                self._cache = {epoch: a}
            return a


def nonce(index: int, final: bool) -> bytes:
    return index.to_bytes(11, "big") + (b"\x01" if final else b"\x00")


_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "cctx", None)
    if cache is None:
        cache = _local.cctx = {}
    c = cache.get(level)
    if c is None:
        c = cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=True)
    return c


def seal_record(
    keys: Keys, index: int, rtype: int, body: bytes, level: int | None, *, final: bool = False
) -> tuple[bytes, bytes]:
    """Compress (if it helps) and seal one record; return (wire bytes, h_i)."""
    h = hashlib.sha256(bytes((rtype,)) + body).digest() if not final else b""
    codec, payload = CODEC_RAW, body
    if level is not None and len(body) > 32:
        packed = _compressor(level).compress(body)
        if len(packed) < len(body):
            codec, payload = CODEC_ZSTD, packed
    pt = bytes((rtype, codec)) + payload
    ct = keys.aead(index).encrypt(nonce(index, final), pt, keys.hh)
    word = len(ct) | (FINAL_BIT if final else 0)
    return _WORD.pack(word) + ct, h


def seal_raw(keys: Keys, index: int, pt: bytes, *, final: bool = False) -> bytes:
    """Seal an already-built plaintext (rtype ‖ codec ‖ payload) as-is (test vectors)."""
    ct = keys.aead(index).encrypt(nonce(index, final), pt, keys.hh)
    return _WORD.pack(len(ct) | (FINAL_BIT if final else 0)) + ct


def final_body(n: int, total: int, root: bytes) -> bytes:
    return _FINAL.pack(n, total, root)


def parse_word(word: bytes, index: int, record_max: int) -> tuple[int, bool]:
    (w,) = _WORD.unpack(word)
    final = bool(w & FINAL_BIT)
    length = w & ~FINAL_BIT
    if length > record_max + RECORD_OVERHEAD or length < RECORD_OVERHEAD:
        raise StreamFault(
            "payload",
            f"record {index} declares a length of {length} bytes, outside the allowed "
            f"{RECORD_OVERHEAD} to {record_max + RECORD_OVERHEAD}",
            hint=_DAMAGED,
        )
    return length, final


def open_record(
    keys: Keys, index: int, ct: bytes, final: bool, record_max: int
) -> tuple[int, bytes, bytes]:
    """Open one sealed record; return (rtype, body, h_i). Raise StreamFault."""
    try:
        pt = keys.aead(index).decrypt(nonce(index, final), ct, keys.hh)
    except InvalidTag:
        raise StreamFault(
            "payload",
            f"record {index} does not authenticate: the stream was altered, its records "
            "reordered, dropped or duplicated, or spliced from another stream",
            hint=_DAMAGED,
        ) from None
    rtype, codec = pt[0], pt[1]
    if final:
        if rtype != RTYPE_FINAL or codec != CODEC_RAW or len(pt) != 2 + FINAL_BODY_LEN:
            raise StreamFault(
                "payload", f"the final record (record {index}) is malformed", hint=_DAMAGED
            )
        return rtype, pt[2:], b""
    if rtype >= RTYPE_FINAL:
        raise StreamFault(
            "payload", f"record {index} has the reserved type {rtype:#04x}", hint=_DAMAGED
        )
    if codec == CODEC_RAW:
        body = pt[2:]
        if len(body) > record_max:
            raise StreamFault("payload", f"record {index} is larger than the limit", hint=_DAMAGED)
    elif codec == CODEC_ZSTD:
        body = _decompress(memoryview(pt)[2:], index, record_max)
    else:
        raise StreamFault(
            "payload", f"record {index} uses an unknown codec {codec:#04x}", hint=_DAMAGED
        )
    return rtype, body, hashlib.sha256(bytes((rtype,)) + body).digest()


def _decompress(payload: memoryview, index: int, record_max: int) -> bytes:
    try:
        size = zstandard.frame_content_size(payload)
    except zstandard.ZstdError:
        size = -2
    if size < 0 or size > record_max:
        what = "does not declare its size" if size < 0 else f"would expand to {size} bytes"
        raise StreamFault(
            "payload",
            f"record {index}'s compressed body {what}; the limit is {record_max} bytes",
            hint="the sender is not a compatible lnk, or the stream is hostile",
        )
    try:
        dctx = zstandard.ZstdDecompressor()
        body = dctx.decompress(payload, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise StreamFault(
            "payload", f"record {index}'s compressed body is invalid ({exc})", hint=_DAMAGED
        ) from None
    if len(body) != size:
        raise StreamFault(
            "payload", f"record {index}'s compressed body has the wrong size", hint=_DAMAGED
        )
    return body
