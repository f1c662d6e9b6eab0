"""The compact blob index answers as the dict it replaces did."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lnk.backup import blobindex
from lnk.backup.blobindex import WIDTH, BlobIndex, BlobRef, IndexBuilder

ids = st.binary(min_size=32, max_size=32)
blob = st.tuples(
    ids, st.sampled_from(["data", "tree"]), st.integers(0, 2**40), st.integers(1, 2**33)
)
packs = st.lists(st.tuples(st.lists(blob, max_size=30), st.booleans()), max_size=8)


@settings(max_examples=200, deadline=None)
@given(packs, st.lists(ids, max_size=10))
def test_every_blob_found_with_an_undamaged_copy_first(
    packs: list[tuple[list[tuple[bytes, str, int, int]], bool]], others: list[bytes]
) -> None:
    b = IndexBuilder()
    copies: dict[bytes, list[tuple[BlobRef, bool]]] = {}
    for n, (blobs, bad) in enumerate(packs):
        name = f"pack-{n}"
        b.add_pack(name, blobs, bad)
        for i, kind, off, length in blobs:
            copies.setdefault(i, []).append((BlobRef(name, off, length, kind), bad))
    index = b.build()
    assert len(index) == len(copies) == index.compact_count
    assert sorted(index) == sorted(copies)
    for i, refs in copies.items():
        ref = index[i]
        good = [r for r, bad in refs if not bad]
        assert ref in (good or [r for r, _ in refs])
        assert i in index and index.get(i) == ref
    for i in others:
        if i not in copies:
            assert i not in index and index.get(i) is None
            try:
                index[i]
            except KeyError:
                pass
            else:
                raise AssertionError("a blob never added was found")


def test_added_blobs_and_odd_keys() -> None:
    b = IndexBuilder()
    a, c = hashlib.sha256(b"a").digest(), hashlib.sha256(b"c").digest()
    b.add_pack("p1", [(a, "data", 5, 10)], False)
    index = b.build()
    assert index[a] == BlobRef("p1", 5, 10, "data")
    index[c] = BlobRef("p2", 0, 3, "tree")  # this run's blob
    index[a] = BlobRef("p3", 1, 2, "data")  # a copy read instead
    assert index[a] == BlobRef("p3", 1, 2, "data") and index[c].pack == "p2"
    assert len(index) == 2 and set(index) == {a, c}
    assert b"short" not in index and "text" not in index and index.get(b"") is None
    assert len(BlobIndex()) == 0 and BlobIndex().get(a) is None


def test_a_blob_takes_54_bytes_of_the_sorted_records() -> None:
    b = IndexBuilder()
    n = 200_000
    b.add_pack(
        "p",
        ((hashlib.sha256(i.to_bytes(4, "big")).digest(), "data", i, 1) for i in range(n)),
        False,
    )
    index = b.build()
    assert index.compact_count == n
    (seg,) = index._segments
    assert len(seg.records) == n * WIDTH == n * 54 and len(seg.heads) == n
    probe = hashlib.sha256((n - 1).to_bytes(4, "big")).digest()
    assert index[probe].offset == n - 1


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(range(40)), st.integers(0, 99)), max_size=120),
    st.integers(1, 40),
    st.sampled_from([6, 12, 1 << 19]),
)
def test_what_is_set_later_reads_as_a_dict_would(
    sets: list[tuple[int, int]], base: int, merge_max: int
) -> None:
    """Set after the build, across segments made and merged, the newest word wins."""
    keys = [hashlib.sha256(bytes([i])).digest() for i in range(40)]
    b = IndexBuilder()
    b.add_pack("base", [(keys[i], "data", i, 1) for i in range(base)], False)
    model = {keys[i]: BlobRef("base", i, 1, "data") for i in range(base)}
    old = blobindex.SEGMENT, blobindex.MERGE_MAX
    blobindex.SEGMENT = 3  # a segment every 3 entries: many made, many merged
    blobindex.MERGE_MAX = merge_max
    try:
        index = b.build()
        for i, off in sets:
            ref = BlobRef(f"run-{off % 5}", off, 2, "tree" if off % 2 else "data")
            index[keys[i]] = ref
            model[keys[i]] = ref
        assert all(s.count <= max(merge_max, base) for s in index._segments[1:])
        if merge_max > 1000:
            assert len(index._segments) <= 8
        assert dict(index.items()) == model
        assert len(index) == len(model) and sorted(index) == sorted(model)
        index.compact()
        assert {k: index[k] for k in model} == model
        # one segment of it all (what a backup keeps as it ends), read back from its parts
        assert index.whole(0) is None or not model
        whole = index.whole(10**6)
        assert whole is not None and len(whole._segments) <= 1
        assert dict(BlobIndex.from_parts(whole.parts()).items()) == model
    finally:
        blobindex.SEGMENT, blobindex.MERGE_MAX = old


def test_a_wrong_id_is_refused_when_set() -> None:
    with pytest.raises(ValueError, match="5 bytes"):
        BlobIndex()[b"short"] = BlobRef("p", 0, 1, "data")


@settings(max_examples=100, deadline=None)
@given(packs, st.lists(ids, max_size=10), st.lists(st.tuples(ids, st.integers(0, 3)), max_size=5))
def test_packs_of_answers_as_get_does(
    packs: list[tuple[list[tuple[bytes, str, int, int]], bool]],
    others: list[bytes],
    later: list[tuple[bytes, int]],
) -> None:
    """Many blobs at once: the packs of those held (what :meth:`get` names), the rest
    missing, in order; a short tail is missing too."""
    b = IndexBuilder()
    for n, (blobs, bad) in enumerate(packs):
        b.add_pack(f"pack-{n}", blobs, bad)
    index = b.build()
    for blob_id, n in later:  # set after the build: the newest word
        index[blob_id] = BlobRef(f"run-{n}", 0, 1, "data")
    asked = [i for blobs, _ in packs for i, *_ in blobs] + others + [i for i, _ in later]
    got, missing = index.packs_of(b"".join(asked) + b"tail")
    held = [index.get(i) for i in asked]
    assert got == {r.pack for r in held if r is not None}
    assert missing == [i for i, r in zip(asked, held, strict=True) if r is None] + [b"tail"]
