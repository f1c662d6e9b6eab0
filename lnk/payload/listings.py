"""A folder's listing: the text its fingerprint is the SHA-256 of, written and read.

Each entry directly in a folder is one line: a file, link or device by its lstat (name,
mode, size, mtime, ctime, inode, links; :func:`entry_key`), a subfolder by its mode and
digest (:func:`dir_key`).  The digest walks (lnk/payload/digests.py) and a first backup
(:class:`FolderPrint`) write it; a final send notes each folder's, and leaving reads the
files back from it (:func:`left_files`) to tell what a person changed in a kept folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat

from lnk.payload.hashcache import HashCache
from lnk.payload.walk import SQLITE_SIDECARS


def entry_key(name: str, st: os.stat_result) -> str:
    """An entry's part of its folder's fingerprint: its lstat.  A subfolder's part is
    :func:`dir_key` (its mode and digest: what its stats come to)."""
    return (
        f"{name}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
        f"\0{st.st_ino}\0{st.st_nlink}\n"
    )


def dir_key(name: str, mode: int, digest: str) -> str:
    return f"{name}\0{mode}\0d{digest}\n"


def listing_text(keys: list[str]) -> bytes:
    """A folder's entries' parts, as one text: what its fingerprint is the SHA-256 of."""
    return "".join(keys).encode("utf-8", "surrogateescape")


def fingerprint(keys: list[str]) -> bytes:
    return hashlib.sha256(listing_text(keys)).digest()


class FolderPrint:
    """A folder's fingerprint made by a walk that reads its files anyway (a first
    backup), entry by entry, so the folder's digest is remembered as
    :func:`tree_digests` would remember it and the next run only stats it.

    ``fresh``: an entry changed at or after it (the walk's start less ``RACY_NS``)
    makes the folder racy: not remembered.  An entry the walk left out without a word
    (a SQLite sidecar, a link it could not carry) is missing from the fingerprint:
    one with it then differs, and one without it has this digest, which does not
    hold it either."""

    __slots__ = ("files", "fresh", "keys", "racy")

    def __init__(self, fresh: int) -> None:
        self.fresh = fresh
        self.keys: list[tuple[str, str]] = []  # (name, its part), the walk's order
        self.racy = False
        self.files = 0  # regular files at any depth

    def entry(self, name: str, st: os.stat_result) -> None:
        """An entry directly in the folder (not a subfolder), by the lstat the walk saw."""
        self.keys.append((name, entry_key(name, st)))
        self.files += stat.S_ISREG(st.st_mode)
        if max(st.st_mtime_ns, st.st_ctime_ns) >= self.fresh:
            self.racy = True

    def subfolder(self, name: str, mode: int, digest: str, files: int) -> None:
        self.keys.append((name, dir_key(name, mode, digest)))
        self.files += files

    def remember(
        self,
        cache: HashCache,
        rel: str,
        digest: str,
        skipped: tuple[tuple[str, os.stat_result], ...],
    ) -> None:
        """Remember ``digest`` as the folder's, if it has one and nothing was racy;
        ``skipped``: the walk's devices, fifos and sockets in it (put in name order
        with the rest; none is a regular file)."""
        for name, st in skipped:
            self.entry(name, st)
        if digest and not self.racy:
            keys = sorted(self.keys) if skipped else self.keys
            cache.store_folder(rel, fingerprint([k for _, k in keys]), digest, self.files)


def sidecar(name: str, names: set[str]) -> bool:
    """A SQLite database's -wal, -shm or -journal beside it (folded into its snapshot)."""
    return name.endswith(SQLITE_SIDECARS) and any(
        name.endswith(s) and name[: -len(s)] in names for s in SQLITE_SIDECARS
    )


# one entry of a listing (entry_key, dir_key): a name has no NUL but may hold
# a newline; a subfolder's part is its mode and digest
_ENTRY = re.compile(rb"([^\0]*)\0(\d+)\0(?:d[0-9a-f]*|(\d+)\0(-?\d+)\0(-?\d+)\0(\d+)\0\d+)\n")


def left_files(text: bytes) -> dict[str, tuple[int, int, int, int]]:
    """The regular files of a folder's listing (a SQLite database's sidecars left out,
    as ``digests.regular_files``): name -> (size, mtime, ctime, inode).  A listing that
    does not parse whole counts as none: every file there is then one a person changed."""
    found: dict[str, tuple[int, int, int, int]] = {}
    names: set[str] = set()
    pos = 0
    while pos < len(text):
        m = _ENTRY.match(text, pos)
        if m is None:
            return {}
        pos = m.end()
        name = m[1].decode("utf-8", "surrogateescape")
        names.add(name)
        if m[3] is not None and stat.S_ISREG(int(m[2])):
            found[name] = (int(m[3]), int(m[4]), int(m[5]), int(m[6]))
    return {n: v for n, v in found.items() if not sidecar(n, names)}
