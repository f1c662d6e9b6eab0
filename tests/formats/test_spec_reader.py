"""A second reader, written from docs/stream-format.md alone, opens the success vectors.

It shares no code with lnk.formats (only cryptography, zstandard, hashlib), so
it checks that the document and the implementation say the same thing.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
import zstandard
from cryptography.hazmat.primitives import hashes, hpke
from cryptography.hazmat.primitives.asymmetric import mlkem, x25519
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "stream"


def fields(name: str) -> dict[str, str]:
    lines = (VECTORS / f"{name}.txt").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if not line.startswith("#"))


SUCCESS = sorted(p.stem for p in VECTORS.glob("*.txt") if fields(p.stem)["expect"] == "success")


def spec_read(data: bytes, seed: bytes) -> tuple[bytes, list[tuple[int, bytes]]]:
    x = hashlib.shake_256(seed).digest(96)
    mk = mlkem.MLKEM768PrivateKey.from_seed_bytes(x[:64])
    xk = x25519.X25519PrivateKey.from_private_bytes(x[64:])
    pk = mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw()
    assert data[:8] == b"\x89LNK\r\n\x1a\n"
    fmt, kem, kdf, haead, paead, log2, res = struct.unpack(">HHHHHBB", data[8:20])
    assert (fmt, kem, kdf, haead, paead, log2, res) == (4, 0x647A, 1, 2, 2, 20, 0)
    sid, kid = data[20:36], data[36:68]
    assert kid == hashlib.sha256(pk).digest()
    (mlen,) = struct.unpack(">H", data[68:70])
    meta = data[70 : 70 + mlen]
    (slen,) = struct.unpack(">H", data[70 + mlen : 72 + mlen])
    assert slen == 1168
    prefix = data[: 72 + mlen]
    sealed = data[72 + mlen : 72 + mlen + slen]
    suite = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
    k = suite.decrypt(
        sealed,
        hpke.MLKEM768X25519PrivateKey(mk, xk),
        info=b"lnk/stream/4/hpke\x00" + hashlib.sha256(prefix).digest(),
    )
    hh = hashlib.sha256(prefix + sealed).digest()
    pos, i = 72 + mlen + slen, 0
    out: list[tuple[int, bytes]] = []
    hs: list[bytes] = []
    while True:
        (word,) = struct.unpack(">I", data[pos : pos + 4])
        final, length = bool(word >> 31), word & 0x7FFF_FFFF
        ct = data[pos + 4 : pos + 4 + length]
        pos += 4 + length
        info = b"lnk/stream/4/payload\x00" + hh + struct.pack(">I", i >> 16)
        key = HKDF(hashes.SHA256(), 32, sid, info).derive(k)
        pt = AESGCM(key).decrypt(i.to_bytes(11, "big") + bytes([final]), ct, hh)
        if final:
            assert pt[:2] == b"\x7f\x00" and pos == len(data)
            n, total, root = struct.unpack(">QQ32s", pt[2:])
            assert n == i and total == sum(len(b) for _, b in out)
            assert root == hashlib.sha256(b"".join(hs)).digest()
            return meta, out
        body = pt[2:] if pt[1] == 0 else zstandard.ZstdDecompressor().decompress(pt[2:])
        out.append((pt[0], body))
        hs.append(hashlib.sha256(pt[:1] + body).digest())
        i += 1


@pytest.mark.parametrize("name", SUCCESS)
def test_spec_reader_agrees(name: str) -> None:
    spec = fields(name)
    meta, recs = spec_read(
        (VECTORS / f"{name}.bin").read_bytes(), bytes.fromhex(spec["receiver-seed"])
    )
    assert meta.decode() == spec["meta"]
    h = hashlib.sha256()
    for rtype, body in recs:
        h.update(struct.pack(">BI", rtype, len(body)) + body)
    assert len(recs) == int(spec["records"]) and h.hexdigest() == spec["records-sha256"]


def test_spec_reader_reads_the_agent_payload() -> None:
    """Section 7 as a stranger reads it: entries, a link's target as text, the summary."""
    import json

    spec = fields("success-agent-payload")
    _, recs = spec_read(
        (VECTORS / "success-agent-payload.bin").read_bytes(),
        bytes.fromhex(spec["receiver-seed"]),
    )
    assert [t for t, _ in recs] == [0x01, 0x02, 0x03, 0x05]
    assert json.loads(recs[0][1])["manifest"] == "lnk-move-4.json"
    entries = json.loads(recs[1][1])
    data = recs[2][1]
    files = links = held = 0
    for e in entries:
        if e["t"] == "l":  # section 7.3: a link carries only p, t and l
            assert set(e) == {"p", "t", "l"} and isinstance(e["l"], str) and e["l"]
            links += 1
        elif e["t"] == "f":
            files += 1
            if e["d"]:
                got, data = data[: e["s"]], data[e["s"] :]
                assert hashlib.sha256(got).hexdigest() == e["h"]
        elif "k" in e:  # section 7.3.4: a folder held whole, its digest and nothing below
            assert e["t"] == "d" and set(e) == {"p", "t", "m", "k"}
            assert len(e["k"]) == 64 and int(e["k"], 16) >= 0
            held += 1
            assert not any(x["p"].startswith(e["p"] + "/") for x in entries)
        else:
            assert e["t"] == "d" and set(e) == {"p", "t", "m"}
    assert data == b"" and links == 2 and held == 1
    summary = json.loads(recs[3][1])
    assert summary["entries"] == len(entries) and summary["files"] == files
