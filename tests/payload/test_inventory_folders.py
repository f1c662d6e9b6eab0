"""The inventory's folder arithmetic (lnk.payload.inventory) against its definitions.

``sizes_of`` counts by parent and adds each parent's count up its ancestors;
``outside`` decides each parent folder once.  Both must give exactly what a
walk up from every path gives, for any paths (odd ones included: a leading or
doubled slash, a name repeated at several depths).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lnk.payload.inventory import Inventory, ancestors, outside, sizes_of, under_any

names = st.sampled_from(["a", "b", "c", "ä", "a.b", ""])
paths = st.lists(names, min_size=1, max_size=5).map("/".join)


def sizes_by_definition(rels: list[str]) -> dict[str, int]:
    n: dict[str, int] = {}
    for rel in rels:
        for a in ancestors(rel):
            n[a] = n.get(a, 0) + 1
    return n


@given(st.lists(paths, max_size=40))
def test_sizes_are_what_a_walk_up_from_every_path_counts(rels: list[str]) -> None:
    assert sizes_of(rels) == sizes_by_definition(rels)


@given(st.lists(paths, max_size=40), st.lists(paths, max_size=6))
def test_outside_keeps_exactly_the_paths_under_no_folder(
    rels: list[str], folders: list[str]
) -> None:
    named = dict.fromkeys(folders, "0" * 64)
    items = [(f"v{i}", rel) for i, rel in enumerate(rels)]
    want = [v for v, rel in items if not under_any(rel, named)]
    assert list(outside(items, named)) == want


def test_a_deep_tree_counted_by_folder() -> None:
    rels = [f"Home/p{i % 3}/d{i % 7}/f{i}" for i in range(210)] + ["Home", "top"]
    got = sizes_of(rels)
    assert got["Home"] == 210
    assert got["Home/p0"] == 70
    assert sum(v for k, v in got.items() if k.count("/") == 2) == 210
    assert "top" not in got
    named = {"Home/p1": "x"}
    kept = list(outside([(r, r) for r in rels], named))
    assert len(kept) == 212 - 70 and not any(r.startswith("Home/p1/") for r in kept)


# digests crowded into a few first two bytes (so the index's buckets hold many), and
# the ends of the range
_digests = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from([b"\x00\x00", b"\x00\x01", b"\x12\x34", b"\xff\xff", b"\xff\xfe"]),
    st.binary(min_size=30, max_size=30),
)


@given(st.sets(_digests, max_size=60), st.lists(_digests, max_size=30))
def test_an_inventory_holds_exactly_its_digests(held: set[bytes], asked: list[bytes]) -> None:
    inv = Inventory.of(held)
    back = Inventory.from_bytes(inv.to_bytes())
    for d in [*held, *asked]:
        assert (d in inv) == (d in held) == (d.hex() in back)
    assert b"\x00" * 31 not in inv and b"" not in inv  # not a digest: not held
