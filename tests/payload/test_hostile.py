"""Hostile or damaged streams: each refused with a clear error, the destination unchanged."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from payload_helpers import (
    dentry,
    fentry,
    fill_collections,
    head,
    jl,
    machine_tree,
    make_agent,
    payload,
    prepare,
    public,
    receive_bytes,
    roots,
    seal,
    send_bytes,
    sha,
    write,
)

from lnk.agents.layout import Machine
from lnk.agents.settings import new_agent_id
from lnk.errors import FormatMismatch, Refused, StreamError
from lnk.payload import manifest as M
from lnk.payload.receivers import Receiver

OWNER = "local-hostiletest"
VECTORS = Path(__file__).parent.parent / "vectors" / "stream"


@dataclass
class Dest:
    machine: Machine
    r: Receiver
    agent_id: str
    before: dict[str, Any]

    def head(self, **kw: Any) -> dict[str, Any]:
        return head(self.agent_id, OWNER, **kw)

    def refuse(
        self, data: bytes, exc: type[Exception] = StreamError, match: str | None = None
    ) -> str:
        with pytest.raises(exc, match=match) as info:
            receive_bytes(self.machine, self.r, data)
        assert machine_tree(self.machine) == self.before, "the destination changed"
        assert not (self.r.dir / "commit.json").exists()
        return str(info.value)

    def send(self, records: list[tuple[int, bytes]], **kw: Any) -> bytes:
        return seal(public(self.r), records, **kw)


@pytest.fixture
def dest(dst: Machine, tmp_path: Path) -> Dest:
    """A destination that already holds the agent 'work' (with files, grants, collections)."""
    a = make_agent(dst, agent_id=new_agent_id(), owner=OWNER)
    write(a.folders.home / "docs" / "keep.txt", b"mine\n")
    write(a.folders.agent / "memory" / "old.md", b"old memory\n")
    fill_collections(a)
    (tmp_path / "elsewhere").mkdir()
    r = prepare(dst, a.id)
    return Dest(dst, r, a.id, machine_tree(dst))


def files(
    dest: Dest, entries: list[dict[str, Any]], data: bytes = b"", collections: bytes = b""
) -> bytes:
    return dest.send(payload(dest.head(), roots() + entries, data, collections))


# ---- paths -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("Home/../Config/sandbox.toml", r"'\.\.'"),
        ("Home/docs/../../x", r"'\.\.'"),
        ("/etc/passwd", "absolute"),
        ("Home/a\x00b", "NUL"),
        ("Home/a\nb", "control character"),
        ("Home/a\x1bb", "control character"),
        ("Config/x", "outside the agent's folders"),
        ("Config/sandbox.toml", "outside the agent's folders"),
        (".ssh/authorized_keys", "outside the agent's folders"),
        ("Agent/chats/x", "outside the agent's folders"),
        ("Home//x", "empty"),
        ("Home/./x", r"'\.'"),
        ("Home/" + "n" * 300, "longer than 255"),
    ],
)
def test_bad_paths_are_refused(dest: Dest, path: str, match: str) -> None:
    msg = dest.refuse(files(dest, [fentry(path, b"evil")]), StreamError, match)
    assert "refused the stream" in msg


def test_entry_under_a_file_is_refused(dest: Dest) -> None:
    dest.refuse(
        files(dest, [fentry("Home/f", b""), fentry("Home/f/g", b"x")]),
        StreamError,
        "its folder is a file",
    )


def test_entry_before_its_folder_is_refused(dest: Dest) -> None:
    dest.refuse(files(dest, [fentry("Home/nowhere/g", b"x")]), StreamError, "before its folder")


def test_nothing_is_written_through_a_symlink_at_the_destination(
    dest: Dest, tmp_path: Path
) -> None:
    docs = dest.machine.folders("work").home / "linked"
    os.symlink(tmp_path / "elsewhere", docs)
    dest.before = machine_tree(dest.machine)
    dest.refuse(
        files(dest, [dentry("Home/linked"), fentry("Home/linked/x", b"through")], b"through"),
        Refused,
        "symbolic link",
    )
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_destination_without_home_whose_agent_folder_is_a_link_is_refused(
    dest: Dest, tmp_path: Path
) -> None:
    """With no Home here nothing below it is looked at one by one (a restore on a new
    machine): the folders above it are still seen not to be links, before anything."""
    root = dest.machine.folders("work").root
    moved = tmp_path / "elsewhere" / "work"
    shutil.rmtree(root / "Home")
    root.rename(moved)
    os.symlink(moved, root)
    dest.before = machine_tree(dest.machine)
    dest.refuse(
        files(dest, [dentry("Home/docs"), fentry("Home/docs/x", b"through")], b"through"),
        Refused,
        "symbolic link",
    )
    assert not (moved / "Home").exists()


def test_a_file_where_the_destination_has_a_symlink_replaces_the_link_not_its_target(
    dest: Dest, tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere" / "target"
    target.write_bytes(b"untouched")
    os.symlink(target, dest.machine.folders("work").home / "l")
    assert receive_bytes(dest.machine, dest.r, files(dest, [fentry("Home/l", b"over")], b"over"))
    placed = dest.machine.folders("work").home / "l"
    assert not placed.is_symlink() and placed.read_bytes() == b"over"
    assert target.read_bytes() == b"untouched"


@pytest.mark.parametrize("kind", ["c", "b", "p", "s", None, 1])
def test_devices_fifos_never_travel(dest: Dest, kind: object) -> None:
    e = {"p": "Home/x", "t": kind, "m": 0o644}
    dest.refuse(files(dest, [e]), StreamError, "only files, folders and symbolic links travel")


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"p": "Home/x", "t": "l", "l": "a", "m": 0o777}, "carries only p, t and l"),
        ({"p": "Home/x", "t": "l", "l": ""}, "without a target"),
        ({"p": "Home/x", "t": "l", "l": 5}, "without a target"),
        ({"p": "Home/x", "t": "l", "l": "a\x00b"}, "invalid link target"),
        ({"p": "Home/x", "t": "l", "l": "a" * 4097}, "invalid link target"),
        (
            {"p": "Home/x", "t": "f", "l": "a", "m": 0, "s": 0, "h": "0" * 64, "d": False},
            "not a link",
        ),
    ],
)
def test_bad_link_entries_are_refused(dest: Dest, entry: dict[str, Any], match: str) -> None:
    dest.refuse(files(dest, [entry]), StreamError, match)


def test_nothing_goes_under_a_link_of_the_stream(dest: Dest, tmp_path: Path) -> None:
    dest.refuse(
        files(
            dest,
            [
                {"p": "Home/out", "t": "l", "l": str(tmp_path / "elsewhere")},
                fentry("Home/out/x", b"x"),
            ],
            b"x",
        ),
        StreamError,
        "its folder is a file",
    )
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_link_that_escapes_is_carried_as_text_and_nothing_is_written_through_it(
    dest: Dest, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    data = files(dest, [{"p": "Home/escape", "t": "l", "l": str(outside)}, dentry("Home/docs")])
    assert receive_bytes(dest.machine, dest.r, data).committed
    home = dest.machine.folders("work").home
    assert os.readlink(home / "escape") == str(outside)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Home/Readme", "Home/README"),
        ("Home/\u00e9", "Home/e\u0301"),  # NFC vs NFD
        ("Home/same", "Home/same"),
    ],
)
def test_names_that_fold_alike_are_refused(dest: Dest, a: str, b: str) -> None:
    dest.refuse(
        files(dest, [fentry(a, b""), fentry(b, b"")]), StreamError, "case or Unicode normalisation"
    )


def _lists(dest: Dest, *lists: list[dict[str, Any]]) -> bytes:
    """A stream whose entries come in several FILES records, one per list."""
    records = [(M.HEAD, M.dump(dest.head())), (M.FILES, M.dump(roots() + lists[0]))]
    records += [(M.FILES, M.dump(entries)) for entries in lists[1:]]
    return dest.send(records)


@pytest.mark.parametrize(
    "lists",
    [
        [[fentry("Home/x", b"")], [fentry("Home/x", b"")]],  # in two file lists
        [[dentry("Home/x")], [fentry("Home/X", b"")]],  # a folder, then a file
        [[fentry("Home/x", b""), dentry("Home/x")]],  # a file, then a folder, one list
        [[dentry("Home/x"), dentry("Home/x")]],  # a folder twice
    ],
)
def test_a_path_twice_is_refused_by_name(dest: Dest, lists: list[list[dict[str, Any]]]) -> None:
    msg = dest.refuse(_lists(dest, *lists), StreamError, "appears twice")
    assert "'Home/x'" in msg or "'Home/X'" in msg


@pytest.mark.parametrize(("n", "again"), [(20, 10), (700, 650), (700, 3)])
def test_a_path_twice_in_a_long_list_is_refused_by_the_later_name(
    dest: Dest, n: int, again: int
) -> None:
    """The list goes in a few hundred rows a statement: whichever statement the second
    name falls in, or the first, it is the one named."""
    entries = [fentry(f"Home/f{i}", b"") for i in range(n)] + [fentry(f"Home/F{again}", b"")]
    msg = dest.refuse(_lists(dest, entries), StreamError, "appears twice")
    assert f"'Home/F{again}' appears twice" in msg


@pytest.mark.parametrize(
    ("lists", "match"),
    [
        ([[fentry("Home/f", b"")], [fentry("Home/f/g", b"x")]], "its folder is a file"),
        # Home/d/e is found a folder in the stage's list, so the last list gets checked
        (
            [[dentry("Home/d")], [dentry("Home/d/e")], [fentry("Home/d/e/x", b"")] * 2],
            "'Home/d/e/x' appears twice",
        ),
    ],
)
def test_a_folder_is_found_after_the_recent_entries_are_forgotten(
    dest: Dest, monkeypatch: pytest.MonkeyPatch, lists: list[list[dict[str, Any]]], match: str
) -> None:
    """Past SEEN_MAX the entries of earlier lists are looked up in the stage's list."""
    monkeypatch.setattr("lnk.payload.staging.SEEN_MAX", 0)
    dest.refuse(_lists(dest, *lists), StreamError, match)


def test_unknown_entry_fields_and_bad_values_are_refused(dest: Dest) -> None:
    e = fentry("Home/x", b"")
    e["owner"] = "root"
    dest.refuse(files(dest, [e]), StreamError, "unknown fields")
    for field, value, match in [
        ("m", -1, "invalid mode"),
        ("s", -5, "invalid size"),
        ("h", "zz", "invalid SHA-256"),
        ("mt", -1, "invalid mtime"),
        ("d", "yes", "invalid data flag"),
        ("g", -1, "hard-link group"),
    ]:
        e = fentry("Home/x", b"")
        e[field] = value
        dest.refuse(files(dest, [e]), StreamError, match)


def test_setuid_bits_are_dropped(src: Machine, dst: Machine) -> None:
    r = prepare(dst)
    aid = new_agent_id()
    data = seal(
        public(r), payload(head(aid, OWNER), [*roots(), fentry("Home/x", b"#!", mode=2541)], b"#!")
    )
    receive_bytes(dst, r, data)
    assert os.stat(dst.folders("work").home / "x").st_mode & 0o7777 == 0o755


# ---- content -----------------------------------------------------------------------------
def test_content_longer_than_declared(dest: Dest) -> None:
    e = fentry("Home/x", b"12345")
    dest.refuse(files(dest, [e], b"1234567890"), StreamError, "no entry declared")


def test_content_shorter_than_declared(dest: Dest) -> None:
    e = fentry("Home/x", b"12345")
    dest.refuse(files(dest, [e], b"123"), StreamError, "ended early")


def test_content_with_another_sha(dest: Dest) -> None:
    e = fentry("Home/x", b"12345", sha256=sha(b"54321"))
    dest.refuse(files(dest, [e], b"12345"), StreamError, "do not match its SHA-256")


def test_data_with_no_entry(dest: Dest) -> None:
    dest.refuse(files(dest, [], b"surprise"), StreamError, "no entry declared")


def test_files_record_while_bytes_are_pending(dest: Dest) -> None:
    recs = [
        (M.HEAD, M.dump(dest.head())),
        (M.FILES, M.dump([*roots(), fentry("Home/x", b"abc")])),
        (M.FILES, M.dump([fentry("Home/y", b"")])),
        (M.DATA, b"abc"),
    ]
    dest.refuse(dest.send(recs), StreamError, "ended early")


def test_empty_file_that_says_bytes_follow(dest: Dest) -> None:
    dest.refuse(files(dest, [fentry("Home/x", b"", carry=True)]), StreamError, "empty yet")


def test_empty_file_with_a_wrong_sha(dest: Dest) -> None:
    dest.refuse(
        files(dest, [fentry("Home/x", b"", sha256=sha(b"x"))]), StreamError, "not that of nothing"
    )


def test_content_the_receiver_does_not_hold(dest: Dest) -> None:
    e = fentry("Home/x", b"held nowhere", carry=False)
    dest.refuse(files(dest, [e]), StreamError, "held nowhere")


def test_content_held_outside_the_agent_is_not_reachable(dest: Dest) -> None:
    secret = dest.machine.home / ".ssh" / "id_ed25519"
    write(secret, b"PRIVATE KEY")
    dest.before = machine_tree(dest.machine)
    e = fentry("Home/stolen", b"PRIVATE KEY", carry=False)
    dest.refuse(files(dest, [e]), StreamError, "held nowhere")


def test_hard_link_group_with_mismatching_content(dest: Dest) -> None:
    ents = [fentry("Home/a", b"aaa", group=0), fentry("Home/b", b"bbb", group=0, carry=False)]
    dest.refuse(files(dest, ents, b"aaa"), StreamError, "hard link to a file with other content")


def test_hard_link_that_carries_bytes_again(dest: Dest) -> None:
    ents = [fentry("Home/a", b"aaa", group=0), fentry("Home/b", b"aaa", group=0)]
    dest.refuse(files(dest, ents, b"aaaaaa"), StreamError, "link to an earlier file")


def test_hard_link_group_whose_first_member_is_held_nowhere(dest: Dest) -> None:
    ents = [
        fentry("Home/a", b"aaa", group=3, carry=False),
        fentry("Home/b", b"aaa", group=3, carry=False),
    ]
    dest.refuse(files(dest, ents), StreamError, "held nowhere")


# ---- records and limits -------------------------------------------------------------------------
def test_oversized_json_record(dest: Dest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(M, "MAX_JSON_RECORD", 2000)
    ents = [fentry(f"Home/f{i}", b"") for i in range(100)]
    dest.refuse(files(dest, ents), StreamError, "larger than 2000 bytes")


def test_oversized_collection_line(dest: Dest) -> None:
    line = b'{"t":"collection","pad":"' + b"x" * (M.MAX_COLLECTION_LINE + 10)
    dest.refuse(files(dest, [], collections=line), StreamError, "larger than any collection")


def test_more_entries_than_the_limit(dest: Dest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(M, "MAX_ENTRIES", 12)
    ents = [fentry(f"Home/f{i}", b"") for i in range(20)]
    dest.refuse(files(dest, ents), StreamError, "more than 12 entries")


def test_not_json(dest: Dest) -> None:
    recs = [(M.HEAD, M.dump(dest.head())), (M.FILES, b"[{not json")]
    dest.refuse(dest.send(recs, summary=False), StreamError, "not valid JSON")


def test_unknown_record_type(dest: Dest) -> None:
    recs = [(M.HEAD, M.dump(dest.head())), (0x42, b"?")]
    dest.refuse(dest.send(recs), StreamError, "unknown record type")


def test_stream_without_a_manifest(dest: Dest) -> None:
    dest.refuse(dest.send([(M.FILES, M.dump(roots()))]), StreamError, "not the manifest")


def test_a_second_head(dest: Dest) -> None:
    recs = [
        (M.HEAD, M.dump(dest.head())),
        (M.FILES, M.dump(roots())),
        (M.HEAD, M.dump(dest.head())),
    ]
    dest.refuse(dest.send(recs), StreamError, "second manifest")


def test_a_record_after_the_summary(dest: Dest) -> None:
    recs = payload(dest.head(), roots())
    from payload_helpers import honest_summary

    recs.append((M.SUMMARY, M.dump(honest_summary(recs))))
    recs.append((M.FILES, M.dump([])))
    dest.refuse(dest.send(recs, summary=False), StreamError, "follows the summary")


def test_no_summary(dest: Dest) -> None:
    dest.refuse(dest.send(payload(dest.head(), roots()), summary=False), StreamError, "no summary")


@pytest.mark.parametrize("field", ["entries", "files", "data_bytes", "collections", "records"])
def test_summary_counts_that_lie(dest: Dest, field: str) -> None:
    from payload_helpers import honest_summary

    recs = payload(
        dest.head(),
        [*roots(), fentry("Home/x", b"abc")],
        b"abc",
        jl(
            {"t": "collection", "v": 1, "kind": "notes", "name": "n", "shape": "map"},
            {"t": "end", "count": 0},
        ),
    )
    s = honest_summary(recs)
    s[field] += 1
    dest.refuse(dest.send(recs, summary=s), StreamError, "the summary says")


def test_collection_with_a_gap_in_event_numbers(dest: Dest) -> None:
    coll = jl(
        {
            "t": "collection",
            "v": 1,
            "kind": "events",
            "name": "link:main",
            "shape": "log",
            "since": 0,
        },
        {"t": "event", "n": 1, "data": {"text": "a"}},
        {"t": "event", "n": 3, "data": {"text": "c"}},
        {"t": "end", "count": 2},
    )
    dest.refuse(files(dest, [], collections=coll), StreamError, "collection is invalid")


def test_collection_cut_in_the_middle(dest: Dest) -> None:
    coll = jl({"t": "collection", "v": 1, "kind": "notes", "name": "n", "shape": "map"})
    dest.refuse(files(dest, [], collections=coll), StreamError, "middle of a record")


def test_collection_record_outside_a_collection(dest: Dest) -> None:
    coll = jl({"t": "event", "n": 1, "data": {}})
    dest.refuse(files(dest, [], collections=coll), StreamError, "outside a collection")


# ---- the manifest -------------------------------------------------------------------------------
def test_manifest_of_another_format(dest: Dest) -> None:
    h = dest.head()
    h["manifest"] = "lnk-move-3.json"
    msg = dest.refuse(dest.send(payload(h, roots())), FormatMismatch, "lnk-move-3.json")
    assert "lnk-move-4.json" in msg


def test_stream_of_format_3(dest: Dest) -> None:
    data = (VECTORS / "format-3.bin").read_bytes()
    msg = dest.refuse(data, FormatMismatch, "format 3")
    assert "format 4" in msg


def test_stream_with_format_byte_edited(dest: Dest, src: Machine) -> None:
    a = make_agent(src, agent_id=dest.agent_id, owner=OWNER)
    data, _ = send_bytes(a, dest.r)
    forged = data[:8] + (3).to_bytes(2, "big") + data[10:]
    dest.refuse(forged, FormatMismatch, "format 3.*format 4")


@pytest.mark.parametrize(
    ("part", "value", "match"),
    [
        ("id", "ag-NOPE", "agent ID is invalid"),
        ("id", None, "agent ID is invalid"),
        ("owner", "root", "owner is invalid"),
        ("name", "../../etc", "agent name is invalid"),
        ("name", "", "agent name is invalid"),
    ],
)
def test_invalid_identity_in_the_head(dest: Dest, part: str, value: object, match: str) -> None:
    h = dest.head()
    h["agent"][part] = value
    dest.refuse(dest.send(payload(h, roots())), StreamError, match)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("phase", "sideways", "unknown phase"),
        ("settings", "x", "carries no settings"),
        ("grants", 5, "grants are not text"),
        ("agent", [], "names no agent"),
    ],
)
def test_invalid_head_fields(dest: Dest, key: str, value: object, match: str) -> None:
    h = dest.head()
    h[key] = value
    dest.refuse(dest.send(payload(h, roots())), StreamError, match)


@pytest.mark.parametrize(
    "settings",
    [
        {"format": 2, "ports": {"base": 70000}, "sandbox": True},
        {"format": 2, "turns": "soon", "sandbox": True},
        {"format": 2, "sandbox": "perhaps"},
        {"format": 2},
        {"format": 99, "sandbox": True},
        {"format": "2", "sandbox": True},
    ],
)
def test_nonsense_settings(dest: Dest, settings: dict[str, Any]) -> None:
    dest.refuse(dest.send(payload(dest.head(settings=settings), roots())), StreamError)


def test_unknown_store_driver_in_settings(dst: Machine) -> None:
    r = prepare(dst)
    aid = new_agent_id()
    before = machine_tree(dst)
    with pytest.raises(StreamError, match="unknown store driver"):
        receive_bytes(
            dst,
            r,
            seal(
                public(r),
                payload(head(aid, OWNER, settings={"store": "mongo", "sandbox": True}), roots()),
            ),
        )
    assert machine_tree(dst) == before


# ---- the seal ---------------------------------------------------------------------------------------
@pytest.fixture
def real_stream(dest: Dest, src: Machine) -> bytes:
    a = make_agent(src, agent_id=dest.agent_id, owner=OWNER)
    write(a.folders.home / "big.bin", os.urandom(1_500_000))
    write(a.folders.home / "small.txt", b"small")
    fill_collections(a)
    data, _ = send_bytes(a, dest.r, level=None)
    return data


@pytest.mark.parametrize("frac", [0.0, 0.001, 0.02, 0.3, 0.5, 0.9, 0.9999])
def test_truncated_streams(dest: Dest, real_stream: bytes, frac: float) -> None:
    dest.refuse(real_stream[: int(len(real_stream) * frac)], StreamError)


def test_bytes_appended_after_the_end(dest: Dest, real_stream: bytes) -> None:
    dest.refuse(real_stream + b"\x00", StreamError, "after")


def test_a_byte_flipped(dest: Dest, real_stream: bytes) -> None:
    data = bytearray(real_stream)
    data[len(data) // 2] ^= 1
    dest.refuse(bytes(data), StreamError)


def test_sealed_to_another_receiver(dest: Dest, src: Machine) -> None:
    other = prepare(dest.machine)
    a = make_agent(src, agent_id=dest.agent_id, owner=OWNER)
    data, _ = send_bytes(a, other)
    dest.before = machine_tree(dest.machine)
    dest.refuse(data, StreamError)
    assert (other.dir / "key").exists()


def test_a_receiver_refuses_a_second_receive_after_a_commit(dest: Dest, src: Machine) -> None:
    a = make_agent(src, agent_id=dest.agent_id, owner=OWNER)
    data, _ = send_bytes(a, dest.r)
    receive_bytes(dest.machine, dest.r, data)
    from lnk.errors import NotFound

    with pytest.raises(NotFound):
        receive_bytes(dest.machine, dest.r, data)


def test_a_receiver_for_one_agent_refuses_another(dest: Dest, src: Machine) -> None:
    """Its index covers the expected agent's files: another agent may not reach them."""
    keep = dest.machine.folders("work").home / "docs" / "keep.txt"
    r = dest.r
    aid = new_agent_id()
    ents = [*roots(), fentry("Home/copied", keep.read_bytes(), carry=False)]
    data = seal(public(r), payload(head(aid, OWNER, name="thief"), ents))
    dest.refuse(data, StreamError, "prepared for the agent")
    assert not dest.machine.folders("thief").root.exists()
