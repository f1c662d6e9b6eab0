"""Folders held whole: the digests a sender offers a receiver, and how big a folder
the receiver may name as held whole.

The digest (docs/stream-format.md, 7.3.4) is computed from stats and what the hash
cache remembers (lnk/payload/digests.py), or by a walk with ends
(``walk_agent(..., ends=True)``).  A sender and a backup compute every folder's digest
before they walk, and go into none that the other end holds alike.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from lnk.payload.digests import tree_digests
from lnk.payload.hashcache import HashCache

WHOLE_MAX = 15_000
"""The most files and folders inside a folder that an inventory taken against the sender's
digests names as held whole.  A writer that learns a folder's digest only as its walk
leaves it holds the folder's entries back meanwhile and may give up past 20,000 (a
quarter left for the links an inventory does not count); lnk's sender knows every
digest before it walks, but a folder so named must surely go whole, whoever sends."""


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


def clock(root: Path) -> int:
    """The file-system clock of the agent's folder now (nanoseconds): the change time of a
    file made and removed at once in its ``Config/`` (in no file root, and not beside
    them: the folders holding the file roots keep their change times), so a file's
    change time compares with it whatever this machine's clock says (a network file
    system stamps with its server's).  0 where nothing can be made there: no file is
    then known unchanged since (docs/stream-format.md 7.7)."""
    name = f".lnk-clock-{secrets.token_hex(6)}"
    try:
        folder = os.open(root / "Config", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder
        )
        try:
            return os.fstat(fd).st_ctime_ns
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
    except OSError:
        return 0
    finally:
        os.close(folder)
