"""Round trips, tampering and the API edges of the sealed stream."""

from __future__ import annotations

import io
import os
import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lnk.errors import FormatMismatch, InvalidInput, StreamError
from lnk.formats import (
    FORMAT,
    RECORD_MAX,
    ReceiverKey,
    StreamFault,
    StreamReader,
    StreamWriter,
    peek_format,
    split_body,
)

KEY = ReceiverKey.from_seed(bytes(range(32)))


def seal(recs: list[tuple[int, bytes]], **kw: object) -> bytes:
    buf = io.BytesIO()
    with StreamWriter(buf, KEY.public, {"kind": "test", "n": len(recs)}, **kw) as w:  # type: ignore[arg-type]
        for rtype, body in recs:
            w.write(rtype, body)
    assert w.summary is not None and w.summary.wire_bytes == len(buf.getvalue())
    return buf.getvalue()


def unseal(data: bytes, key: ReceiverKey = KEY, workers: int = 2) -> list[tuple[int, bytes]]:
    reader = StreamReader(io.BytesIO(data), key, workers=workers)
    out = list(reader)
    assert reader.complete
    return out


def body_of(size: int, kind: str, seed: int) -> bytes:
    r = random.Random(seed)
    if kind == "random":
        return r.randbytes(size)
    pattern = b"".join(b'{"seq":%d}\n' % r.randrange(1000) for _ in range(64))
    return (pattern * (size // len(pattern) + 1))[:size]


SIZES = st.one_of(
    st.integers(0, 100),
    st.integers(RECORD_MAX - 40, RECORD_MAX),
    st.sampled_from([0, 1, 33, 4096, RECORD_MAX // 2]),
)
RECORD = st.tuples(st.integers(0, 0x7E), SIZES, st.sampled_from(["random", "text"]), st.integers())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(RECORD, max_size=6),
    st.sampled_from([1, 2, 3]),
    st.sampled_from([1, 2]),
    st.sampled_from([3, None, 1]),
)
def test_round_trip(
    specs: list[tuple[int, int, str, int]], wworkers: int, rworkers: int, level: int | None
) -> None:
    recs = [(t, body_of(n, kind, seed)) for t, n, kind, seed in specs]
    data = seal(recs, workers=wworkers, level=level)
    assert unseal(data, workers=rworkers) == recs


def test_every_single_byte_change_is_refused() -> None:
    data = seal([(1, b"alpha" * 10), (2, os.urandom(100)), (3, b"")])
    for pos in range(len(data)):
        for mask in (0x01, 0x80):
            bad = bytearray(data)
            bad[pos] ^= mask
            with pytest.raises(StreamError):
                unseal(bytes(bad), workers=1)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_tampering_is_refused(data: st.DataObject) -> None:
    stream = bytearray(seal([(5, b"x" * 3000), (6, b"y")], workers=1))
    pos = data.draw(st.integers(0, len(stream) - 1))
    stream[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(StreamError):
        unseal(bytes(stream), workers=1)


def test_every_truncation_is_refused() -> None:
    data = seal([(1, b"alpha"), (2, b"beta")])
    for n in range(len(data)):
        with pytest.raises(StreamError) as info:
            unseal(data[:n])
        assert not isinstance(info.value, StreamFault) or info.value.kind == "truncated"


def test_records_are_yielded_before_the_end_and_the_reader_is_incomplete_until_then() -> None:
    data = seal([(1, b"one"), (2, b"two")])
    reader = StreamReader(io.BytesIO(data), KEY, workers=1)
    it = iter(reader)
    assert next(it) == (1, b"one")
    assert not reader.complete
    assert next(it) == (2, b"two")
    with pytest.raises(StopIteration):
        next(it)
    assert reader.complete and reader.summary is not None
    assert reader.summary.records == 2 and reader.summary.body_bytes == 6
    with pytest.raises(StreamError):
        iter(reader)


def test_wrong_key_says_so() -> None:
    data = seal([(1, b"x")])
    with pytest.raises(StreamFault) as info:
        StreamReader(io.BytesIO(data), ReceiverKey.generate())
    assert info.value.kind == "wrong-key"
    assert "sealed to another receiver" in info.value.message


def test_format_mismatch_names_both_formats() -> None:
    data = bytearray(seal([]))
    data[9] = 3
    with pytest.raises(FormatMismatch) as info:
        StreamReader(io.BytesIO(bytes(data)), KEY)
    assert info.value.message == "this stream is lnk format 3; this lnk reads format 4"
    assert info.value.hint and "upgrade" in info.value.hint
    assert info.value.exit_code == 11


def test_peek_format_does_not_consume() -> None:
    data = seal([(1, b"x")])
    buf = io.BytesIO(data)
    assert peek_format(buf) == FORMAT == 4
    assert unseal(buf.read()) == [(1, b"x")]
    old = bytearray(data)
    old[9] = 3
    assert peek_format(io.BufferedReader(io.BytesIO(bytes(old)))) == 3
    with pytest.raises(StreamFault) as info:
        peek_format(io.BytesIO(b"PK\x03\x04 zip file"))
    assert info.value.kind == "not-lnk" and "zip" in info.value.message


def test_writer_refuses_bad_input() -> None:
    w = StreamWriter(io.BytesIO(), KEY.public)
    with pytest.raises(InvalidInput):
        w.write(0x7F, b"reserved")
    with pytest.raises(InvalidInput):
        w.write(0x80, b"reserved")
    with pytest.raises(InvalidInput):
        w.write(1, bytes(RECORD_MAX + 1))
    w.close()
    with pytest.raises(StreamError):
        w.write(1, b"after close")
    with pytest.raises(InvalidInput):
        StreamWriter(io.BytesIO(), KEY.public, {"big": "x" * 5000})


def test_aborted_writer_leaves_a_stream_that_is_refused_as_cut_short() -> None:
    buf = io.BytesIO()
    with pytest.raises(RuntimeError), StreamWriter(buf, KEY.public) as w:
        w.write(1, b"partial")
        raise RuntimeError("sender failed")
    assert w.summary is None
    with pytest.raises(StreamFault) as info:
        unseal(buf.getvalue())
    assert info.value.kind == "truncated"


def test_split_body_and_write_from() -> None:
    data = body_of(2 * RECORD_MAX + 5, "text", 1)
    assert [len(p) for p in split_body(data)] == [RECORD_MAX, RECORD_MAX, 5]
    assert list(split_body(b"")) == []
    buf = io.BytesIO()
    with StreamWriter(buf, KEY.public) as w:
        assert w.write_from(9, io.BytesIO(data)) == len(data)
    recs = unseal(buf.getvalue())
    assert [t for t, _ in recs] == [9, 9, 9]
    assert b"".join(b for _, b in recs) == data


def test_caller_may_reuse_its_buffer() -> None:
    buf = io.BytesIO()
    scratch = bytearray(b"a" * 1000)
    with StreamWriter(buf, KEY.public, workers=2) as w:
        for i in range(10):
            scratch[:] = bytes([65 + i]) * 1000
            w.write(1, memoryview(scratch))
    assert [b for _, b in unseal(buf.getvalue())] == [bytes([65 + i]) * 1000 for i in range(10)]


def test_streams_through_a_pipe() -> None:
    rfd, wfd = os.pipe()
    recs = [
        (i % 0x7F, body_of(RECORD_MAX - i, "random" if i % 2 else "text", i)) for i in range(12)
    ]
    errors: list[BaseException] = []

    def send() -> None:
        try:
            with os.fdopen(wfd, "wb") as out, StreamWriter(out, KEY.public, {"kind": "pipe"}) as w:
                for rtype, body in recs:
                    w.write(rtype, body)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=send)
    t.start()
    with os.fdopen(rfd, "rb") as inp:
        reader = StreamReader(inp, KEY)
        assert reader.meta == {"kind": "pipe"}
        got = list(reader)
    t.join(timeout=60)
    assert not t.is_alive() and not errors
    assert got == recs


@pytest.mark.parametrize("workers", [1, 2])
def test_a_flushed_first_record_reaches_the_reader_before_anything_follows(workers: int) -> None:
    """A writer's ``flush`` puts what it has on the wire, and a reader hands out the first
    record as it arrives, not once more records fill its look-ahead: a receiver starts
    its work on a HEAD while the sender is still walking (here the writer writes nothing
    more until the reader has the first record)."""
    rfd, wfd = os.pipe()
    first = threading.Event()
    errors: list[BaseException] = []

    def send() -> None:
        try:
            with os.fdopen(wfd, "wb") as out, StreamWriter(out, KEY.public, workers=2) as w:
                w.write(1, b"head")
                w.flush()
                if not first.wait(timeout=30):
                    raise AssertionError("the reader never had the first record")
                w.write(2, b"rest")
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=send)
    t.start()
    with os.fdopen(rfd, "rb") as inp:
        it = iter(StreamReader(inp, KEY, workers=workers))
        assert next(it) == (1, b"head")
        first.set()
        assert list(it) == [(2, b"rest")]
    t.join(timeout=60)
    assert not t.is_alive() and not errors


def test_a_writer_that_is_closed_or_aborted_does_not_flush() -> None:
    w = StreamWriter(io.BytesIO(), KEY.public)
    w.close()
    with pytest.raises(StreamError, match="closed"):
        w.flush()
    w = StreamWriter(io.BytesIO(), KEY.public)
    w.abort()
    with pytest.raises(StreamError, match="aborted"):
        w.flush()
