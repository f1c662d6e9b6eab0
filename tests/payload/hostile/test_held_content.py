"""Content the receiver holds (``d = false``) is read without following a link and hashed
again as it is copied: swapped folders and changed files refuse the receive."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile_kit import Dest, dentry, dump, fentry, head, records, roots, sha, summary_of, tree

from lnk.agents.layout import Machine
from lnk.agents.settings import new_agent_id
from lnk.errors import StreamError
from lnk.payload import manifest as M
from lnk.payload.receive import receive_records

REFUSED = 6
KEEP = b"mine\n"  # Home/docs/keep.txt of the dest fixture, indexed at --prepare
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- not the agent's\n"


def _swap_for_link(folder: Path, outside: Path) -> None:
    """What an agent can do from inside its sandbox after --prepare: its folder becomes a
    link to somewhere else (here a folder outside HOME holding a file of the same name)."""
    outside.mkdir()
    (outside / "keep.txt").write_bytes(SECRET)
    (outside / "old.md").write_bytes(SECRET)
    os.rename(folder, folder.with_name(folder.name + "-moved"))
    os.symlink(outside, folder)


def test_a_home_folder_swapped_for_a_link_leaks_nothing(dest: Dest, tmp_path: Path) -> None:
    _swap_for_link(dest.agent_root / "Home" / "docs", tmp_path / "outside")
    dest.before = tree(dest.home)
    data = dest.stream(records(dest.head(), [*roots(), fentry("Home/stolen", KEEP, carry=False)]))
    msg = dest.refuse(data, REFUSED, r"content of Home/stolen .*symbolic link")
    assert "keep.txt" in msg
    assert not (dest.agent_root / "Home" / "stolen").exists()
    assert sha(SECRET) not in {v[-1] for v in tree(dest.home).values()}


def test_an_agent_folder_swapped_for_a_link_leaks_nothing(dest: Dest, tmp_path: Path) -> None:
    """The old Agent/ is hard-linked from rather than copied: that path is guarded too."""
    _swap_for_link(dest.agent_root / "Agent" / "memory", tmp_path / "outside")
    dest.before = tree(dest.home)
    data = dest.stream(
        records(
            dest.head(), [*roots(), fentry("Agent/memory/new.md", b"old memory\n", carry=False)]
        )
    )
    dest.refuse(data, REFUSED, r"content of Agent/memory/new\.md .*symbolic link")
    assert (tmp_path / "outside" / "old.md").stat().st_nlink == 1


def test_a_held_file_that_changed_is_not_applied_under_its_old_sha(dest: Dest) -> None:
    keep = dest.agent_root / "Home" / "docs" / "keep.txt"
    keep.write_bytes(b"changed after --prepare\n")
    dest.before = tree(dest.home)
    data = dest.stream(records(dest.head(), [*roots(), fentry("Home/copy", KEEP, carry=False)]))
    dest.refuse(data, REFUSED, r"content of Home/copy .*changed since the receiver was prepared")


def test_a_held_file_that_changed_in_place_is_not_taken_as_unchanged(dest: Dest) -> None:
    """The stream says Home/docs/keep.txt is as indexed; it is not any more: its old bytes
    are nowhere, so the receive is refused (rather than the cache told the new bytes are
    the old SHA-256)."""
    keep = dest.agent_root / "Home" / "docs" / "keep.txt"
    keep.write_bytes(b"changed after --prepare\n")
    dest.before = tree(dest.home)
    ents = [*roots(), dentry("Home/docs"), fentry("Home/docs/keep.txt", KEEP, carry=False)]
    dest.refuse(dest.stream(records(dest.head(), ents)), REFUSED, "changed since")


def test_a_held_file_replaced_by_a_fifo_is_refused(dest: Dest) -> None:
    keep = dest.agent_root / "Home" / "docs" / "keep.txt"
    keep.unlink()
    os.mkfifo(keep)
    dest.before = tree(dest.home)
    data = dest.stream(records(dest.head(), [*roots(), fentry("Home/copy", KEEP, carry=False)]))
    dest.refuse(data, REFUSED, "no longer a regular file")


def test_held_content_still_saves_the_bytes_when_nothing_changed(dest: Dest) -> None:
    ents = [
        *roots(),
        dentry("Home/docs"),
        fentry("Home/docs/keep.txt", KEEP, carry=False),
        fentry("Home/copy", KEEP, carry=False),
        fentry("Agent/memory/old.md", b"old memory\n", carry=False),
        fentry("Agent/memory/again.md", b"old memory\n", carry=False),
    ]
    dest.accept(dest.stream(records(dest.head(), ents)))
    home = dest.agent_root / "Home"
    assert (home / "copy").read_bytes() == KEEP
    assert (home / "docs" / "keep.txt").read_bytes() == KEEP
    memory = dest.agent_root / "Agent" / "memory"
    assert (memory / "old.md").read_bytes() == (memory / "again.md").read_bytes() == b"old memory\n"
    assert sha(KEEP) == sha((home / "copy").read_bytes())


def test_content_carried_earlier_in_the_stream_is_found_small_or_big(fresh: Dest) -> None:
    """Equal content travels once (7.3.3): a later entry without bytes finds it, whether
    its first copy came in the same FILES record or an earlier one, and whether the
    receiver linked it into its objects as it arrived (big) or only once asked (small)."""
    small, big = b"a note\n", os.urandom(200_000)
    first = [
        *roots(),
        fentry("Home/small.txt", small),
        fentry("Home/big.bin", big),
        fentry("Home/same-record.txt", small, carry=False),
        fentry("Home/same-record.bin", big, carry=False),
    ]
    later = [
        dentry("Home/later"),
        fentry("Home/later/small.txt", small, carry=False),
        fentry("Home/later/big.bin", big, carry=False),
    ]
    recs = records(fresh.head(), first, small + big, summary=None)
    recs.append((M.FILES, dump(later)))
    recs.append((M.SUMMARY, dump(summary_of(recs))))
    fresh.accept(fresh.stream(recs))
    home = fresh.agent_root / "Home"
    for name in ("small.txt", "same-record.txt", "later/small.txt"):
        assert (home / name).read_bytes() == small
    for name in ("big.bin", "same-record.bin", "later/big.bin"):
        assert (home / name).read_bytes() == big
    # each its own file: a later change of one is no change of another
    assert (home / "small.txt").stat().st_ino != (home / "later/small.txt").stat().st_ino


def test_content_of_a_file_carried_with_bytes_never_serves_as_held_unless_sent(
    fresh: Dest,
) -> None:
    """A small file's content is not in the objects as it arrives: an entry without
    bytes of content nobody carried is still refused."""
    ents = [
        *roots(),
        fentry("Home/a.txt", b"carried\n"),
        fentry("Home/b.txt", b"never\n", carry=False),
    ]
    fresh.refuse(fresh.stream(records(fresh.head(), ents, b"carried\n")), 10, "held nowhere")


def test_a_restore_never_finds_content_by_an_earlier_entry(tmp_path: Path) -> None:
    """A backup's snapshot carries the bytes of every file that has any: a restore takes
    no entry without bytes as held (nothing is linked into its objects)."""
    home = tmp_path / "home"
    home.mkdir()
    ents = [*roots(), fentry("Home/a.txt", b"once\n"), fentry("Home/b.txt", b"once\n", carry=False)]
    recs = records(head(new_agent_id()), ents, b"once\n")
    with pytest.raises(StreamError, match="held nowhere"):
        receive_records(Machine(home), recs)
    assert not (home / "Link" / "Agents" / "work").exists()
