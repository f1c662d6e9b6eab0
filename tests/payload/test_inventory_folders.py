"""The inventory's folder arithmetic (lnk.payload.inventory) against its definitions.

``sizes_of`` counts by parent and adds each parent's count up its ancestors; a
receiver's index lists the content outside the folders it names by ranges of its
path index.  Both must give exactly what a walk up from every path gives, for any
paths (odd ones included: names that sort around ``/``, a name repeated at several
depths).
"""

from __future__ import annotations

import sqlite3

from hypothesis import given
from hypothesis import strategies as st

from lnk.payload.inventory import Inventory, ancestors, sizes_of, under_any
from lnk.payload.local_index import _outside

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


named_paths = st.lists(
    st.sampled_from(["a", "b", "a-b", "a.b", "a0", "ä", "Home"]), min_size=1, max_size=4
).map("/".join)


def _outside_of(rels: list[str], named: dict[str, str]) -> list[str]:
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE c (sha TEXT, path TEXT, rel TEXT)")
    con.executemany("INSERT INTO c VALUES (?, ?, ?)", [(r, "", r) for r in rels])
    con.execute("CREATE INDEX c_rel ON c(rel)")
    return [sha for (sha,) in _outside(con, named)]


@given(st.lists(named_paths, max_size=40), st.lists(named_paths, max_size=6))
def test_the_content_outside_the_named_folders_is_exactly_the_paths_under_none(
    rels: list[str], folders: list[str]
) -> None:
    # named as an inventory names them: none inside another
    named = {f: "0" * 64 for f in folders if not under_any(f, dict.fromkeys(folders))}
    want = sorted(r for r in rels if not under_any(r, named))
    assert sorted(_outside_of(rels, named)) == want


def test_a_deep_tree_counted_by_folder() -> None:
    rels = [f"Home/p{i % 3}/d{i % 7}/f{i}" for i in range(210)] + ["Home", "top"]
    got = sizes_of(rels)
    assert got["Home"] == 210
    assert got["Home/p0"] == 70
    assert sum(v for k, v in got.items() if k.count("/") == 2) == 210
    assert "top" not in got
    kept = _outside_of(rels, {"Home/p1": "x", "Home/p1-b": "x"})
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
