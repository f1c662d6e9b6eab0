"""Folders held whole (docs/stream-format.md 7.3.4) at a receive's commit: each checked
at use against what the base holds then, and put in place by one rename that follows
no link on the way (the base may change between the check and the apply).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from lnk.errors import Refused
from lnk.payload.digests import tree_digests
from lnk.payload.hashcache import HashCache
from lnk.payload.receivers import Receiver
from lnk.payload.safefs import Conflict, dest_kind, open_parent
from lnk.payload.staging import Stage

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def held_whole(
    stage: Stage, r: Receiver, agent_root: Path
) -> tuple[int, list[list[str]], set[str]]:
    """The folders the stream says this machine holds whole, each checked now (at use,
    not only at prepare): the base's folder at that path still has that digest.

    Returns how many Home files they hold where they already are, the renames that put
    the others in what is staged (``[base, path, staged]``), and their paths in the
    base (none of their files may be hard-linked elsewhere: they stay the agent's own)."""
    held = stage.held_folders()
    if not held:
        return 0, [], set()
    info = r.info()
    base, cache_path = info.get("base_root"), info.get("base_cache")
    if not base or not cache_path:
        raise Conflict(f"{held[0][0]} is said to be held here whole, but nothing is held here")
    root = Path(base)
    walked = stage.base_walked()
    if walked is None:  # the walk beside the stream failed: once more, here
        cache = HashCache(Path(cache_path), readonly=True)
        try:
            walked = tree_digests(root, cache)
        finally:
            cache.close()
    digests, counts = walked
    same, adopt, whole = 0, [], set()
    for path, digest in held:
        if digests.get(path) != digest:
            raise Refused(
                f"{path} was to stay as this machine held it when the receiver was prepared "
                f"({root / path}), but it changed since",
                hint="nothing was applied; prepare a new receiver "
                "(lnk agent state-receive --prepare) and send again",
            )
        whole.add(str(root / path))
        if root == agent_root and (path == "Home" or path.startswith("Home/")):
            same += counts.get(path, 0)  # in place already: nothing to do
        else:
            adopt.append([str(root), path, stage.staged(path)])
    return same, adopt, whole


def adopt_whole(renames: list[list[str]]) -> list[str]:
    """Folders held here whole go into what is staged by one rename each, reached
    without following a link (``safefs.open_parent``); where the staged folder exists
    already (a root such as Home/), what it lacks moves into it.

    Each is done once: a crash between two leaves some done, and a source gone is done.
    Returns the folders not taken because a link or a file is now on the way."""
    skipped: list[str] = []
    for root, path, dst in renames:
        try:
            pfd, name = open_parent(Path(root), path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                skipped.append(path)
            continue
        try:
            _move_in(pfd, name, dst, path, skipped)
        finally:
            os.close(pfd)
    return skipped


def _move_in(pfd: int, name: str, dst: str, path: str, skipped: list[str]) -> None:
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return  # moved already
    if not stat.S_ISDIR(st.st_mode):
        skipped.append(path)
        return
    if not os.path.lexists(dst):
        os.rename(name, dst, src_dir_fd=pfd)
        return
    stack = [(os.open(name, _DIR, dir_fd=pfd), dst)]
    while stack:
        fd, d = stack.pop()
        try:
            with os.scandir(fd) as it:
                for e in it:
                    t = os.path.join(d, e.name)
                    if not os.path.lexists(t):
                        os.rename(e.name, t, src_dir_fd=fd)
                    elif e.is_dir(follow_symlinks=False) and dest_kind(t, dst) == "d":
                        stack.append((os.open(e.name, _DIR, dir_fd=fd), t))
        finally:
            os.close(fd)
