"""Symbolic links in Home survive a backup and a restore as links, never followed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from bk_helpers import give_keys, sample_agent, write

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.backup.agent import backup_agent
from lnk.backup.agent_repos import open_for_listing
from lnk.backup.agent_restore import restore_agent
from lnk.errors import InvalidInput
from lnk.payload.manifest import FILE_ROOTS
from lnk.transport.buckets import open_bucket

LINKS = {
    "proj/node_modules/.bin/tool": "../tool/cli.js",  # a Node project's bin link
    "venv/bin/python": "/usr/bin/python3",  # a virtualenv's interpreter, absolute
    "dangling": "no/such/file",
    "outside": "/etc/hostname",  # a target outside HOME: carried as text, not content
}


def _links(home: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(home):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[str(p.relative_to(home))] = os.readlink(p)
    return out


def _regular_bytes(root: Path) -> int:
    seen: dict[tuple[int, int], int] = {}
    for r in FILE_ROOTS:
        for dirpath, _dirs, files in os.walk(root / r):
            for name in files:
                st = os.lstat(Path(dirpath) / name)
                if stat.S_ISREG(st.st_mode):
                    seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def test_links_round_trip_as_links(src: Machine, dst: Machine, url: str) -> None:
    a = sample_agent(src)
    h = a.folders.home
    write(h / "proj" / "node_modules" / "tool" / "cli.js", b"console.log(1)\n", 0o755)
    for rel, target in LINKS.items():
        (h / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, h / rel)
    rep = backup_agent(src, a, url)
    assert rep.files == 7  # the sample's six files and cli.js: no link counted as a file
    give_keys(src, dst)
    restore_agent(dst, "work", url)
    b = registry.find(dst, "work")
    assert _links(b.folders.home) == LINKS
    # the one real file a link names arrived as the file, once
    cli = b.folders.home / "proj" / "node_modules" / "tool" / "cli.js"
    assert cli.read_bytes() == b"console.log(1)\n" and not cli.is_symlink()
    # the link that points outside HOME came back as a link, not as the file it names
    assert (b.folders.home / "outside").is_symlink()
    # the bytes stored are the regular files' alone: nothing was read through a link
    assert rep.bytes == _regular_bytes(a.folders.root)


def test_a_name_that_is_not_utf8_is_refused_naming_it(src: Machine, local_url: str) -> None:
    """A backup carries UTF-8 names only: such a file is named in the refusal, not
    left out of a snapshot without a word (it would be lost at a restore)."""
    a = sample_agent(src)
    folder = a.folders.home / "docs"
    folder.mkdir(exist_ok=True)
    with open(os.fsencode(str(folder)) + b"/caf\xe9.txt", "wb") as f:
        f.write(b"latin-1 named\n")
    with pytest.raises(InvalidInput, match=r"docs/caf\\xe9\.txt: the name is not UTF-8") as err:
        backup_agent(src, a, local_url)
    assert err.value.hint is not None and err.value.hint.startswith("ls -b -- ")
    repo = open_for_listing(src, open_bucket(local_url), local_url)
    assert repo.list_snapshots() == []
