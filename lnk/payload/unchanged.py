"""What a sender knows unchanged since the digests its receiver's inventory was named
against (docs/stream-format.md 7.7, "Unchanged since the digests").

The receiver names a folder held whole when it holds it as the sender had it at
``at`` (the sender's file-system clock as its digests walk began, given back in the
inventory).  When that folder changed since, the send walks into it; what inside it
has not changed since is still the receiver's, at the same path, and need not travel:

* a folder is *in place* when no rename can have put it where it is since: it is the
  named folder, or lies directly in a folder in place, and either it or the folder
  holding it has not changed since (a rename sets both's change times, an entry added
  or removed in it only its own);
* a subfolder in place whose every entry, at any depth, has not changed since is the
  receiver's as it is: it goes as one entry held whole, with its digest now;
* a regular file of a folder in place that has not changed since (its bytes, its
  links, its name: each sets its change time) goes without its bytes.

"Since" is ``at`` less :data:`MARGIN_NS`.  A sender that is wrong costs a refused
stream, never a wrong file: the receiver checks every folder held whole and every
content it takes.
"""

from __future__ import annotations

import os
from pathlib import Path

MARGIN_NS = 50_000_000
"""How long before the sender's digests a change must be for it to count as before them.
Small: the digests' time is the file system's own clock read just before the walk, so a
change after it has a change time at or after it (one in the same tick counts as after:
the comparison is strict), and a change before it is in the digests (the walk comes
after); this only covers that clock set back a little."""

Times = dict[str, tuple[int, int]]
"""Folder path -> (its own change time, the newest change time in it at any depth)."""


class SinceDigests:
    """The rules above for one send: ``named`` (the folders the inventory names held
    whole), ``at`` (0: unsaid, nothing is known unchanged), the agent's folder ``root``."""

    def __init__(self, named: dict[str, str], at: int, root: Path | str) -> None:
        self.named = named
        self.before = at - MARGIN_NS if at > MARGIN_NS else 0
        self.root = str(root)
        self.in_place: dict[str, int] = {}  # folder -> its change time

    def __bool__(self) -> bool:
        return bool(self.before and self.named)

    def _above(self, parent: str) -> int | None:
        """The change time of a folder above the file roots (or not walked): its lstat."""
        try:
            return os.lstat(f"{self.root}/{parent}" if parent else self.root).st_ctime_ns
        except OSError:
            return None

    def _placed(self, rel: str, own: int, placed: dict[str, int], up: int | None) -> bool:
        """The rule: ``rel`` (its change time ``own``) is in place when it is named, or
        lies directly in a folder of ``placed`` (folder -> change time), and it or the
        folder holding it has not changed since; then it joins ``placed``.  ``up``: the
        holding folder's change time for a named one, if the walk knows it."""
        parent = rel.rpartition("/")[0]
        if rel in self.named:
            up = up if up is not None else self._above(parent)
        else:
            up = placed.get(parent)
        if up is None or min(own, up) >= self.before:
            return False
        placed[rel] = own
        return True

    def folder(self, rel: str, ctime: int) -> bool:
        """Note a folder the walk goes into, by its change time; whether it is in place."""
        return bool(self) and self._placed(rel, ctime, self.in_place, None)

    def file(self, rel: str, st: os.stat_result | None) -> bool:
        """A regular file (no hard link, no snapshot: the caller's part) of a folder in
        place, unchanged since the digests: the receiver holds it at this path."""
        return (
            st is not None
            and bool(self.in_place)
            and st.st_ctime_ns < self.before
            and rel.rpartition("/")[0] in self.in_place
        )

    def quiet(self, times: Times) -> set[str]:
        """From a walk's :data:`Times` (every folder, parents before their subfolders'
        decision is asked): the folders inside a named one that are in place and have
        not changed since at any depth (a subfolder so goes held whole, with its digest
        now)."""
        out: set[str] = set()
        placed: dict[str, int] = {}
        for rel in sorted(times, key=lambda p: p.count("/")):  # outer folders first
            own, newest = times[rel]
            parent = times.get(rel.rpartition("/")[0])
            if (
                self._placed(rel, own, placed, parent[0] if parent else None)
                and rel not in self.named
                and newest < self.before
            ):
                out.add(rel)
        return out
