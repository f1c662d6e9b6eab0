"""The records of the sealed stream, format 4 (docs/stream-format.md).

The pure, stateless pieces that follow the header (``header.py``): the
per-epoch payload keys, and the sealing and opening of one record.
``stream.py`` and ``reader.py`` drive them over a file.
"""

from __future__ import annotations

import hashlib
import struct
import threading

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from lnk.formats.header import DAMAGED, Header, StreamFault

TAG_LEN = 16
RECORD_OVERHEAD = 2 + TAG_LEN  # rtype + codec + tag
FINAL_BIT = 0x8000_0000
RTYPE_FINAL = 0x7F
CODEC_RAW = 0
CODEC_ZSTD = 1
FINAL_BODY_LEN = 48
EPOCH_SHIFT = 16
MAX_RECORDS = 1 << 48
PAYLOAD_INFO = b"lnk/stream/4/payload\x00"

_WORD = struct.Struct(">I")
_FINAL = struct.Struct(">QQ32s")


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
) -> tuple[bytes | bytearray, bytes]:
    """Compress (if it helps) and seal one record; return (wire bytes, h_i).

    (No copy of a body where one can be spared: the hash takes it in two parts, and
    the sealed bytes are written behind their length word in one buffer.)"""
    h = record_hash(rtype, body) if not final else b""
    codec, payload = CODEC_RAW, body
    if level is not None and len(body) > 32:
        packed = _compressor(level).compress(body)
        if len(packed) < len(body):
            codec, payload = CODEC_ZSTD, packed
    pt = bytes((rtype, codec)) + payload
    wire = bytearray(_WORD.size + len(pt) + TAG_LEN)
    keys.aead(index).encrypt_into(nonce(index, final), pt, keys.hh, memoryview(wire)[_WORD.size :])
    _WORD.pack_into(wire, 0, (len(pt) + TAG_LEN) | (FINAL_BIT if final else 0))
    return wire, h


def record_hash(rtype: int, body: bytes | bytearray | memoryview) -> bytes:
    """h_i: SHA-256 of the record's type byte and its body (docs/stream-format.md)."""
    h = hashlib.sha256(bytes((rtype,)))
    h.update(body)
    return h.digest()


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
            hint=DAMAGED,
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
            hint=DAMAGED,
        ) from None
    rtype, codec = pt[0], pt[1]
    if final:
        if rtype != RTYPE_FINAL or codec != CODEC_RAW or len(pt) != 2 + FINAL_BODY_LEN:
            raise StreamFault(
                "payload", f"the final record (record {index}) is malformed", hint=DAMAGED
            )
        return rtype, pt[2:], b""
    if rtype >= RTYPE_FINAL:
        raise StreamFault(
            "payload", f"record {index} has the reserved type {rtype:#04x}", hint=DAMAGED
        )
    if codec == CODEC_RAW:
        body = pt[2:]
        if len(body) > record_max:
            raise StreamFault("payload", f"record {index} is larger than the limit", hint=DAMAGED)
    elif codec == CODEC_ZSTD:
        body = _decompress(memoryview(pt)[2:], index, record_max)
    else:
        raise StreamFault(
            "payload", f"record {index} uses an unknown codec {codec:#04x}", hint=DAMAGED
        )
    return rtype, body, record_hash(rtype, body)


class ZstdFrameError(ValueError):
    """A body that is not exactly one zstd frame of the size it declares, within a bound:
    ``reason`` is "size" (none declared, ``size`` < 0, or past the bound), "invalid"
    (``detail`` says why) or "length" (it decompressed to another size)."""

    def __init__(self, reason: str, size: int, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail or size}")
        self.reason, self.size, self.detail = reason, size, detail


def decompress_exact(
    payload: bytes | memoryview, limit: int, dctx: zstandard.ZstdDecompressor | None = None
) -> bytes:
    """One zstd frame that declares its content size, at most ``limit`` bytes, and
    decompresses to exactly that (nothing after it): never more is allocated than it
    declared.  A stream's record bodies, and a restore's chunks between its two
    processes, are opened through this; ``ZstdFrameError`` otherwise."""
    try:
        size = zstandard.frame_content_size(payload)
    except zstandard.ZstdError:
        size = -2
    if size < 0 or size > limit:
        raise ZstdFrameError("size", size)
    try:
        d = dctx or zstandard.ZstdDecompressor()
        body = d.decompress(payload, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise ZstdFrameError("invalid", size, str(exc)) from None
    if len(body) != size:
        raise ZstdFrameError("length", size)
    return body


def _decompress(payload: memoryview, index: int, record_max: int) -> bytes:
    try:
        return decompress_exact(payload, record_max)
    except ZstdFrameError as e:
        if e.reason == "size":
            size = e.size
            what = "does not declare its size" if size < 0 else f"would expand to {size} bytes"
            raise StreamFault(
                "payload",
                f"record {index}'s compressed body {what}; the limit is {record_max} bytes",
                hint="the sender is not a compatible lnk, or the stream is hostile",
            ) from None
        what = f"is invalid ({e.detail})" if e.reason == "invalid" else "has the wrong size"
        raise StreamFault(
            "payload", f"record {index}'s compressed body {what}", hint=DAMAGED
        ) from None
