"""Generate the sealed-stream test vectors in tests/vectors/stream/.

    python tests/vectors/generate.py

Each case is two files: ``<case>.bin`` (the stream) and ``<case>.txt``
("key: value" lines). Keys of the .txt:

    case             the name
    expect           success | not-lnk | format-mismatch | unsupported | wrong-key
                     | header | payload | truncated | trailing
    receiver-seed    hex of the 32-byte seed of the key to read with
    meta             (success) the metadata JSON the reader must report
    records          (success) how many records it must yield
    records-sha256   (success) SHA-256 over, for each record in order,
                     rtype (1 byte) ‖ u32 big-endian body length ‖ body
    note             what the case is

Everything is derived from fixed seeds except HPKE's encapsulation randomness
(cryptography does not let a caller inject it), so re-running the generator
changes the bytes of the streams but never their expectations.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import struct
from collections.abc import Callable
from pathlib import Path

import zstandard

from lnk.formats import header as H
from lnk.formats import records as R
from lnk.formats.keys import ReceiverKey
from lnk.formats.stream import RECORD_MAX, StreamWriter, split_body

OUT = Path(__file__).resolve().parent / "stream"
SEED_A = hashlib.sha256(b"lnk test vector receiver A").digest()
SEED_B = hashlib.sha256(b"lnk test vector receiver B").digest()
KEY_A = ReceiverKey.from_seed(SEED_A)
KEY_B = ReceiverKey.from_seed(SEED_B)
META = {"kind": "test"}

Records = list[tuple[int, bytes]]


def rng_for(name: str) -> Callable[[int], bytes]:
    r = random.Random(hashlib.sha256(name.encode()).digest())
    return r.randbytes


def text_bytes(n: int, name: str) -> bytes:
    """Compressible, deterministic agent-like text (keeps the vector files small)."""
    r = random.Random(name)
    words = [b"memory", b"skill", b"chat", b"tool", b"agent", b"note", b"todo", b"file"]
    out = bytearray()
    i = 0
    while len(out) < n:
        out += b'{"n":%d,"w":"%s"}\n' % (i, r.choice(words))
        i += 1
    return bytes(out[:n])


def records_digest(recs: Records) -> str:
    h = hashlib.sha256()
    for rtype, body in recs:
        h.update(struct.pack(">BI", rtype, len(body)) + body)
    return h.hexdigest()


def write_stream(
    name: str, recs: Records, key: ReceiverKey = KEY_A, level: int | None = 3, workers: int = 2
) -> bytes:
    buf = io.BytesIO()
    with StreamWriter(buf, key.public, META, rng=rng_for(name), level=level, workers=workers) as w:
        for rtype, body in recs:
            w.write(rtype, body)
    return buf.getvalue()


def frame(stream: bytes) -> tuple[bytes, list[bytes]]:
    """Split a stream into its header and its records (word ‖ ciphertext each)."""
    meta_len = struct.unpack(">H", stream[68:70])[0]
    pos = 70 + meta_len + 2 + H.SEALED_LEN
    head, recs = stream[:pos], []
    while pos < len(stream):
        length = struct.unpack(">I", stream[pos : pos + 4])[0] & ~R.FINAL_BIT
        recs.append(stream[pos : pos + 4 + length])
        pos += 4 + length
    return head, recs


def hand_sealed(name: str, plaintexts: list[bytes], final_n: int | None = None) -> bytes:
    """A stream whose record plaintexts (rtype ‖ codec ‖ payload) are given as-is."""
    draw = rng_for(name)
    sid, k = draw(16), draw(32)
    meta = H.canonical_meta(META)
    header = H.build_header(KEY_A.public.raw, KEY_A.public.hpke_key, meta, sid, k)
    keys = R.Keys(k, header)
    out = [header.raw]
    root = hashlib.sha256()
    total = 0
    for i, pt in enumerate(plaintexts):
        out.append(R.seal_raw(keys, i, pt))
        root.update(hashlib.sha256(pt[:1] + pt[2:]).digest())
        total += len(pt) - 2
    n = len(plaintexts)
    body = R.final_body(n if final_n is None else final_n, total, root.digest())
    out.append(R.seal_raw(keys, n, bytes((R.RTYPE_FINAL, 0)) + body, final=True))
    return b"".join(out)


def flip_word(rec: bytes, value: int | None = None, xor: int = 0) -> bytes:
    (w,) = struct.unpack(">I", rec[:4])
    w = value if value is not None else w ^ xor
    return struct.pack(">I", w) + rec[4:]


def agent_payload() -> Records:
    """HEAD, one FILES batch (folders, a file with bytes, an empty file, a symbolic link
    whose target leaves the agent), its DATA, and SUMMARY (docs/stream-format.md 7)."""

    def j(obj: object) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    body = b"print('hello')\n"
    entries = [
        {"p": "Home", "t": "d", "m": 0o755},
        {"p": "Home/src", "t": "d", "m": 0o755},
        {
            "p": "Home/src/main.py",
            "t": "f",
            "m": 0o644,
            "s": len(body),
            "h": hashlib.sha256(body).hexdigest(),
            "d": True,
            "mt": 1_700_000_000_000_000_000,
        },
        {
            "p": "Home/empty",
            "t": "f",
            "m": 0o600,
            "s": 0,
            "h": hashlib.sha256().hexdigest(),
            "d": False,
            "mt": 0,
        },
        # a folder the receiver holds whole (7.3.4): one entry, nothing below it
        {
            "p": "Home/vendor",
            "t": "d",
            "m": 0o755,
            "k": "7227ec25e2a01c3bc2ddc5d30a505fbd67c06a972ebc948fe33d03e6a2cf5c84",
        },
        {"p": "Home/python", "t": "l", "l": "/usr/bin/python3"},
        {"p": "Home/src/latest", "t": "l", "l": "main.py"},
    ]
    head = {
        "manifest": "lnk-move-4.json",
        "format": 4,
        "agent": {"id": "ag-" + "a" * 20, "owner": "local-vectors", "name": "work"},
        "settings": {"format": 2},
        "grants": "",
        "phase": "full",
        "base_stream": None,
    }
    summary = {
        "entries": len(entries),
        "files": 2,
        "data_bytes": len(body),
        "collections": 0,
        "records": 0,
    }
    return [(0x01, j(head)), (0x02, j(entries)), (0x03, body), (0x05, j(summary))]


def cases() -> list[tuple[str, str, bytes, ReceiverKey, Records | None, str]]:
    out: list[tuple[str, str, bytes, ReceiverKey, Records | None, str]] = []

    def ok(name: str, recs: Records, note: str, level: int | None = 3, workers: int = 2) -> None:
        data = write_stream(name, recs, level=level, workers=workers)
        out.append((name, "success", data, KEY_A, recs, note))

    def bad(name: str, expect: str, data: bytes, note: str, key: ReceiverKey = KEY_A) -> None:
        out.append((name, expect, data, key, None, note))

    ok("success-empty", [], "no records, only the final record")
    ok("success-one-record", [(0x01, b"hello, agent\n")], "the worked example of the spec")
    rnd = random.Random(7).randbytes(4096)
    ok(
        "success-mixed",
        [(0x00, b""), (0x01, rnd), (0x7E, text_bytes(50_000, "m")), (0x02, b"x")],
        "empty body, raw (incompressible) body, zstd body, edge record types",
    )
    for label, size in (
        ("minus-1", RECORD_MAX - 1),
        ("exact", RECORD_MAX),
        ("plus-1", RECORD_MAX + 1),
    ):
        data = text_bytes(size, label)
        recs = [(0x03, bytes(p)) for p in split_body(data)]
        ok(f"success-1mib-{label}", recs, f"{size} bytes cut into records of at most 1 MiB")
    ok(
        "success-uncompressed",
        [(0x01, text_bytes(3000, "u")), (0x01, b"tail")],
        "writer with compression off: stored bodies",
        level=None,
        workers=1,
    )

    ok(
        "success-agent-payload",
        agent_payload(),
        "an agent's payload (section 7): a link entry, a folder held whole",
    )

    base_recs: Records = [
        (0x01, b"record zero " * 4),
        (0x02, b"record one " * 5),
        (0x01, b"record two"),
    ]
    base = write_stream("base", base_recs)
    head, wire = frame(base)
    fin = wire[-1]

    bad("truncated-empty", "truncated", b"", "no bytes at all")
    bad("truncated-in-header", "truncated", base[:500], "cut inside the sealed key")
    bad(
        "truncated-mid-record",
        "truncated",
        base[: len(head) + len(wire[0]) + 10],
        "cut inside record 1",
    )
    bad("truncated-at-boundary", "truncated", head + b"".join(wire[:3]), "no final record")
    bad("truncated-header-only", "truncated", head, "a header and nothing else")
    bad("trailing-bytes", "trailing", base + b"\x00", "one byte after the final record")
    bad("trailing-second-stream", "trailing", base + base, "two streams back to back")
    bad("reordered", "payload", head + wire[0] + wire[2] + wire[1] + fin, "records 1 and 2 swapped")
    bad(
        "duplicated",
        "payload",
        head + wire[0] + wire[1] + wire[1] + wire[2] + fin,
        "record 1 twice",
    )
    bad("dropped", "payload", head + wire[0] + wire[2] + fin, "record 1 left out")
    other = frame(write_stream("other", base_recs))[1]
    bad(
        "spliced",
        "payload",
        head + wire[0] + other[1] + wire[2] + fin,
        "record 1 taken from another stream to the same key, same plaintext",
    )
    bad(
        "spliced-header",
        "payload",
        frame(write_stream("other", base_recs))[0] + b"".join(wire),
        "another stream's header with these records",
    )
    bad(
        "final-flag-set",
        "payload",
        head + wire[0] + flip_word(wire[1], xor=R.FINAL_BIT) + wire[2] + fin,
        "record 1 marked final",
    )
    bad(
        "final-flag-cleared",
        "payload",
        head + b"".join(wire[:3]) + flip_word(fin, xor=R.FINAL_BIT),
        "the final record marked not final",
    )
    bad(
        "oversized-record-length",
        "payload",
        head + wire[0] + flip_word(wire[1], value=0x7FFF_FFFF) + wire[2] + fin,
        "record 1 claims 2 GiB",
    )
    bad(
        "undersized-record-length",
        "payload",
        head + wire[0] + flip_word(wire[1], value=3) + wire[2] + fin,
        "record 1 claims 3 bytes",
    )
    edited = bytearray(base)
    edited[72] ^= 0x01  # a metadata byte
    bad("header-meta-edited", "header", bytes(edited), "one metadata byte changed")
    edited = bytearray(base)
    edited[25] ^= 0x01
    bad("header-stream-id-edited", "header", bytes(edited), "one stream id byte changed")
    edited = bytearray(base)
    edited[len(head) - 5] ^= 0x01
    bad("header-sealed-key-edited", "header", bytes(edited), "one byte of the sealed key changed")
    bad(
        "header-suite-edited",
        "unsupported",
        base[:10] + b"\x00\x20" + base[12:],
        "kem id changed to 0x0020",
    )
    bad(
        "header-payload-aead-edited",
        "unsupported",
        base[:16] + b"\x00\x03" + base[18:],
        "payload aead changed to ChaCha20-Poly1305",
    )
    bad("header-rec-log2-edited", "unsupported", base[:18] + b"\x1e" + base[19:], "rec_log2 = 30")
    bad(
        "header-meta-len-oversized",
        "header",
        base[:68] + b"\xff\xff" + base[70:],
        "meta_len = 65535",
    )
    bad(
        "header-sealed-len-edited",
        "header",
        base[:85] + b"\xff\xff" + base[87:],
        "sealed_len = 65535",
    )
    bad("format-3", "format-mismatch", H.MAGIC + b"\x00\x03" + bytes(range(64)), "an older format")
    bad("format-5", "format-mismatch", H.MAGIC + b"\x00\x05" + bytes(range(64)), "a newer format")
    bad("not-lnk-text", "not-lnk", b'{"agent": "not a stream"}\n', "JSON text")
    bad("not-lnk-ssh-banner", "not-lnk", b"SSH-2.0-OpenSSH_9.2\r\n", "an SSH banner")
    bad("not-lnk-zstd", "not-lnk", zstandard.ZstdCompressor().compress(b"x" * 100), "a zstd file")
    bad(
        "wrong-key",
        "wrong-key",
        write_stream("wrong", base_recs, key=KEY_B),
        "sealed to receiver B",
    )
    bad("key-id-edited", "wrong-key", base[:36] + bytes(32) + base[68:], "key id zeroed")

    bomb = zstandard.ZstdCompressor().compress(bytes(4 * RECORD_MAX))
    bad(
        "zstd-bomb",
        "payload",
        hand_sealed("bomb", [b"\x01\x01" + bomb]),
        f"a {len(bomb)}-byte frame that expands to 4 MiB",
    )
    nosize = zstandard.ZstdCompressor(write_content_size=False).compress(b"abc" * 1000)
    bad(
        "zstd-no-content-size",
        "payload",
        hand_sealed("nosize", [b"\x01\x01" + nosize]),
        "a frame that does not declare its size",
    )
    good = zstandard.ZstdCompressor().compress(b"abc" * 1000)
    bad(
        "zstd-extra-bytes",
        "payload",
        hand_sealed("extra", [b"\x01\x01" + good + b"\x00"]),
        "a frame followed by a byte",
    )
    bad("zstd-two-frames", "payload", hand_sealed("two", [b"\x01\x01" + good + good]), "two frames")
    bad("unknown-codec", "payload", hand_sealed("codec", [b"\x01\x02abc"]), "codec 0x02")
    bad("reserved-rtype", "payload", hand_sealed("rtype", [b"\x80\x00abc"]), "record type 0x80")
    bad(
        "final-rtype-not-final",
        "payload",
        hand_sealed("fin", [b"\x7f\x00" + bytes(48)]),
        "type 0x7F without the final flag",
    )
    bad(
        "final-count-wrong",
        "payload",
        hand_sealed("count", [b"\x01\x00abc"], final_n=2),
        "the final record counts 2 records, 1 came",
    )
    bad("final-only-missing-records", "payload", head + fin, "all records dropped")
    return out


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        old.unlink()
    all_cases = cases()
    for name, expect, data, key, recs, note in all_cases:
        lines = [
            "# lnk sealed stream test vector, format 4 (tests/vectors/generate.py)",
            f"case: {name}",
            f"expect: {expect}",
            f"receiver-seed: {key.seed.hex()}",
        ]
        if recs is not None:
            lines += [
                f"meta: {json.dumps(META, sort_keys=True, separators=(',', ':'))}",
                f"records: {len(recs)}",
                f"records-sha256: {records_digest(recs)}",
            ]
        lines.append(f"note: {note}")
        (OUT / f"{name}.txt").write_text("\n".join(lines) + "\n")
        (OUT / f"{name}.bin").write_bytes(data)
    print(f"wrote {len(all_cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
