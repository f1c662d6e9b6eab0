"""Folders held whole: the sender's folder digests, and a walk where a folder the
receiver holds with the same digest at the same path comes as one entry.

The digest (docs/stream-format.md, 7.3.4) is computed by the walk itself
(``walk_agent(..., ends=True)``), or from stats and what the hash cache remembers
(lnk/payload/digests.py); here are its uses: the digests a sender offers and the
collapse of a walk (a backup's, where the digests come only as the walk goes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from lnk.payload.digests import tree_digests
from lnk.payload.hashcache import HashCache
from lnk.payload.walk import WalkedFile

COLLAPSE_LIMIT = 20_000
"""The most walked entries :func:`collapse` holds back while a folder that may be kept is
open; a held folder with more is sent entry by entry (its subfolders still may go whole)."""

WHOLE_MAX = COLLAPSE_LIMIT * 3 // 4
"""The most files and folders inside a folder that an inventory taken against the sender's
digests names as held whole (a quarter of the limit left for the links it does not count):
such a folder, when no folder around it is named, is always kept whole if it matches, by
the sender (lnk/payload/send.py) and by a writer that holds entries back (:func:`collapse`)."""


def sending_digests(root: Path, cache_path: Path) -> dict[str, str]:
    """The folders' digests a send of the agent at ``root`` would compute now (its walk
    reads only its hash cache, as the send's does): what a receiver's inventory is
    taken against (docs/stream-format.md 7.7).  Nothing is hashed; the cache remembers
    the folders' digests it had to compute (lnk/payload/digests.py)."""
    cache = HashCache(cache_path if cache_path.exists() else None)
    try:
        return tree_digests(root, cache)[0]
    finally:
        cache.close()


def collapse(
    items: Iterator[WalkedFile],
    held: dict[str, str],
    limit: int = COLLAPSE_LIMIT,
    *,
    ends: bool = False,
    accept: Callable[[str, str], bool] | None = None,
    weigh: bool = False,
) -> Iterator[WalkedFile]:
    """A walk with ends, where every folder whose digest the other end holds at the same
    path comes as one entry (``kept``) instead of its contents.

    Entries are held back only while a folder that might be kept is open, and never
    more than ``limit`` of them (past that they go, and the folders open then do not
    collapse: their subfolders still may).  ``accept(path, digest)`` has the last word
    on a folder whose digest matches (a backup checks it can put it back from what it
    stored).  Ends are dropped, or with ``ends`` kept for the folders not collapsed.
    With ``weigh``, a kept folder counts as every entry it stands for (a backup holds
    its lines until it goes), so at most ``limit`` walked entries are ever held back."""
    buf: list[WalkedFile] = []
    back = 0  # walked entries held back (with weigh: kept folders' contents too)
    open_: list[int] = []  # per open folder: its index in buf if it may be kept, else -1
    candidates = 0
    for f in items:
        if f.kind == "e":
            at = open_.pop()
            if at < 0:
                if ends:
                    if candidates:
                        buf.append(f)
                    else:
                        yield f
                continue
            candidates -= 1
            if (
                f.sha256
                and held.get(f.rel) == f.sha256
                and (accept is None or accept(f.rel, f.sha256))
            ):
                d = buf[at]
                del buf[at:]
                buf.append(WalkedFile(d.rel, "d", d.mode, kept=f.sha256))
            elif ends:
                buf.append(f)
            if not candidates:
                yield from buf
                buf.clear()
                back = 0
            continue
        if f.kind == "d":
            if f.rel in held:
                candidates += 1
                open_.append(len(buf))
                buf.append(f)
                continue
            open_.append(-1)
        if candidates:
            buf.append(f)
            back += 1
            if (back if weigh else len(buf)) > limit:
                yield from buf
                buf.clear()
                open_ = [-1] * len(open_)
                candidates = back = 0
        else:
            yield f
    yield from buf
