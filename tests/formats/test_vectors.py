"""Every test vector in tests/vectors/stream/ reads as its .txt says."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from lnk.errors import FormatMismatch, StreamError
from lnk.formats import ReceiverKey, StreamFault, StreamReader

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "stream"
CASES = sorted(p.stem for p in VECTORS.glob("*.txt"))


def load(name: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in (VECTORS / f"{name}.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition(": ")
            fields[key] = value
    return fields


def test_there_are_vectors_of_every_kind() -> None:
    expects = {load(name)["expect"] for name in CASES}
    assert expects == {
        "success",
        "not-lnk",
        "format-mismatch",
        "unsupported",
        "wrong-key",
        "header",
        "payload",
        "truncated",
        "trailing",
    }


@pytest.mark.parametrize("name", CASES)
def test_vector(name: str) -> None:
    spec = load(name)
    assert spec["case"] == name
    key = ReceiverKey.from_seed(bytes.fromhex(spec["receiver-seed"]))
    expect = spec["expect"]
    with (VECTORS / f"{name}.bin").open("rb") as inp:
        if expect == "success":
            reader = StreamReader(inp, key)
            assert reader.meta == json.loads(spec["meta"])
            assert reader.format == 4
            digest = hashlib.sha256()
            count = 0
            for rtype, body in reader:
                assert 0 <= rtype <= 0x7E
                digest.update(struct.pack(">BI", rtype, len(body)) + body)
                count += 1
            assert count == int(spec["records"])
            assert digest.hexdigest() == spec["records-sha256"]
            assert reader.complete and reader.summary is not None
            assert reader.summary.records == count
            return
        with pytest.raises(StreamError) as info:
            for _ in StreamReader(inp, key):
                pass
    err = info.value
    assert err.message and err.hint
    if expect == "format-mismatch":
        assert isinstance(err, FormatMismatch)
        assert "this lnk reads format 4" in err.message
    else:
        assert isinstance(err, StreamFault), repr(err)
        assert err.kind == expect, f"{err.kind}: {err.message}"
