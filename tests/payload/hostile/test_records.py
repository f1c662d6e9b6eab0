"""Records that do not open: the error names the record, and nothing after it is used."""

from __future__ import annotations

import struct

import pytest
import zstandard
from hostile_kit import Dest, Forge, dentry, dump, fentry, records, roots, summary_of

from lnk.formats import header as H
from lnk.formats import records as R
from lnk.payload import manifest as M

STREAM = 10
BIG = b"b" * 5000


def _honest(dest: Dest) -> list[tuple[int, bytes]]:
    """HEAD, FILES (one file of 5000 bytes), DATA in five records, SUMMARY."""
    recs = records(dest.head(), [*roots(), fentry("Home/x", BIG)])
    files = recs[:2]
    data = [(M.DATA, BIG[i : i + 1000]) for i in range(0, 5000, 1000)]
    body = [*files, *data]
    return [*body, (M.SUMMARY, dump(summary_of(body)))]


def _wire_offset(f: Forge, index: int) -> int:
    return len(f.header.raw) + sum(len(w) for w in f.wire[:index])


@pytest.mark.parametrize("index", [0, 1, 2, 4, 7])
def test_a_flipped_byte_names_its_record(dest: Dest, index: int) -> None:
    f = dest.forge().add_all(_honest(dest))
    data = bytearray(f.final())
    data[_wire_offset(f, index) + 20] ^= 0x40
    dest.refuse(bytes(data), STREAM, rf"^lnk: error: record {index} does not (verify|authenticate)")


def test_a_record_spliced_from_another_stream(dest: Dest) -> None:
    a = dest.forge().add_all(_honest(dest))
    b = dest.forge().add_all(_honest(dest))
    a.wire[3] = b.wire[3]
    dest.refuse(a.final(), STREAM, r"record 3 does not (verify|authenticate)")


def test_two_records_swapped(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest))
    f.wire[2], f.wire[3] = f.wire[3], f.wire[2]
    dest.refuse(f.final(), STREAM, r"record 2 does not (verify|authenticate)")


@pytest.mark.parametrize("rtype", [0x7F, 0x80, 0xFF])
def test_a_reserved_record_type_in_the_middle(dest: Dest, rtype: int) -> None:
    f = dest.forge()
    recs = _honest(dest)
    f.add_all(recs[:3])
    f.add_plain(bytes((rtype, 0)) + BIG[1000:2000], M.DATA, BIG[1000:2000])
    f.add_all(recs[4:])
    dest.refuse(f.final(), STREAM, rf"record 3 has the reserved type {rtype:#04x}")


@pytest.mark.parametrize("rtype", [0x00, 0x06, 0x42, 0x7E])
def test_an_unassigned_payload_type(dest: Dest, rtype: int) -> None:
    f = dest.forge()
    recs = _honest(dest)
    f.add_all(recs[:3]).add(rtype, b"?").add_all(recs[3:])
    dest.refuse(f.final(), STREAM, rf"record 3 .*type {rtype:#x}|unknown record type {rtype:#x}")


@pytest.mark.parametrize("codec", [2, 0x7F, 0xFF])
def test_an_unknown_codec(dest: Dest, codec: int) -> None:
    f = dest.forge()
    recs = _honest(dest)
    f.add_all(recs[:2]).add_plain(bytes((M.DATA, codec)) + BIG[:1000], M.DATA, BIG[:1000])
    f.add_all(recs[3:])
    dest.refuse(f.final(), STREAM, rf"record 2 uses an unknown codec {codec:#04x}")


def _frame(body: bytes, *, size: bool = True) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=size).compress(body)


def _patch_size(frame: bytes, size: int) -> bytes:
    """A frame whose header says ``size`` (a 4-byte Frame_Content_Size field)."""
    fhd = frame[4]
    assert fhd >> 6 == 2 or fhd >> 6 == 1, "expected a 2- or 4-byte size field"
    if fhd >> 6 == 1:  # 2 bytes (size - 256): widen to 4
        raise AssertionError("use a body of 65536 bytes or more")
    single = bool(fhd & 0x20)
    at = 5 + (0 if single else 1) + [0, 1, 2, 4][fhd & 3]
    return frame[:at] + struct.pack("<I", size) + frame[at + 4 :]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda b: _frame(b, size=False), "does not declare its size"),
        (lambda b: _patch_size(_frame(b), len(b) - 1), "(is invalid|has the wrong size)"),
        (lambda b: _patch_size(_frame(b), len(b) + 1), "(is invalid|has the wrong size)"),
        (lambda b: _patch_size(_frame(b), 4 << 20), "would expand to 4194304 bytes"),
        (lambda b: _frame(b) + b"\x00", "is invalid"),
        (lambda b: _frame(b) + _frame(b"x"), "is invalid"),
        (lambda b: _frame(b)[:-3], "(is invalid|has the wrong size)"),
        (lambda b: b"\x28\xb5\x2f\xfd" + b"\x00" * 20, "(is invalid|does not declare)"),
    ],
)
def test_lying_zstd_frames(dest: Dest, make: object, match: str) -> None:
    body = bytes(range(256)) * 300  # 76800 bytes: a 4-byte size field
    ents = [*roots(), fentry("Home/z", body)]
    recs = records(dest.head(), ents)
    f = dest.forge().add_all(recs[:2])
    f.add_plain(bytes((M.DATA, R.CODEC_ZSTD)) + make(body), M.DATA, body)  # type: ignore[operator]
    f.add(M.SUMMARY, dump(summary_of([*recs[:2], (M.DATA, body)])))
    dest.refuse(f.final(), STREAM, rf"record 2's compressed body {match}")


def test_a_record_longer_than_the_limit(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest)[:2])
    data = f.bytes() + struct.pack(">I", H.RECORD_MAX + R.RECORD_OVERHEAD + 1) + b"\x00" * 64
    dest.refuse(data, STREAM, r"record 2 declares a length of")


def test_a_record_shorter_than_a_tag(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest)[:2])
    data = f.bytes() + struct.pack(">I", 17) + b"\x00" * 17
    dest.refuse(data, STREAM, r"record 2 declares a length of 17")


@pytest.mark.parametrize(
    ("n", "total", "root", "match"),
    [
        (6, None, None, "final record does not match"),
        (None, 1, None, "final record does not match"),
        (None, None, b"\x00" * 32, "final record does not match"),
    ],
)
def test_a_final_record_that_counts_wrong(
    dest: Dest, n: int | None, total: int | None, root: bytes | None, match: str
) -> None:
    f = dest.forge().add_all(_honest(dest))
    dest.refuse(f.final(n, total, root), STREAM, match)


def test_a_final_flag_on_an_ordinary_record(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest)[:2])
    data = f.bytes() + R.seal_raw(f.keys, f.index, bytes((M.DATA, 0)) + b"x", final=True)
    dest.refuse(data, STREAM, r"final record \(record 2\) is malformed")


def test_no_final_record(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest))
    dest.refuse(f.bytes(), STREAM, "without its final record")


def test_bytes_after_the_final_record(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest))
    dest.refuse(f.final() + b"\x00", STREAM, "bytes after the stream's final record")


def test_a_second_final_record(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest))
    one = f.final()
    dest.refuse(one + one[-(4 + 2 + 48 + 16) :], STREAM, "after the stream's final record")


def test_a_head_cut_over_two_records(dest: Dest) -> None:
    head = dump(dest.head())
    f = dest.forge().add(M.HEAD, head[:40]).add(M.HEAD, head[40:])
    dest.refuse(f.final(), STREAM, "manifest record is not valid JSON")


def test_metadata_longer_than_4096(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest))
    data = bytearray(f.final())
    data[68:70] = struct.pack(">H", 4097)
    dest.refuse(bytes(data), STREAM, "4097 bytes of metadata")


def test_an_edited_header_byte(dest: Dest) -> None:
    f = dest.forge().add_all(_honest(dest))
    data = bytearray(f.final())
    data[30] ^= 1  # in the stream id
    dest.refuse(bytes(data), STREAM, "header does not verify")


def test_metadata_nested_deeply(dest: Dest) -> None:
    meta = {"kind": "lnk-move"}
    f = Forge(dest.pub, meta=meta)
    raw = b"[" * 3000 + b"]" * 1000
    prefix_len = len(f.header.raw) - H.SEALED_LEN - 2
    assert prefix_len >= 70
    # build a header around hostile metadata with the format's own builder
    h = H.build_header(f.pub.raw, f.pub.hpke_key, raw, b"\x01" * 16, f.key)
    f.header = h
    f.keys = R.Keys(f.key, h)
    f.add_all(_honest(dest))
    dest.refuse(f.final(), STREAM, "metadata is not a JSON object")


def test_a_record_after_a_failed_one_never_reaches_the_files(dest: Dest) -> None:
    """Record 3 fails; record 4 would name a file.  Only record 3 is blamed."""
    recs = _honest(dest)
    f = dest.forge().add_all(recs[:3])
    f.add_plain(bytes((M.DATA, 9)) + b"?", M.DATA, b"?")
    f.add(M.FILES, dump([dentry("Home/after")]))
    f.add_all(recs[3:])
    msg = dest.refuse(f.final(), STREAM, r"record 3 uses an unknown codec")
    assert "Home/" not in msg
