"""Folders held whole (docs/stream-format.md 7.3.4) at a receive's commit: each checked
at use against what the base holds then, and put in place by one rename.
"""

from __future__ import annotations

import os
from pathlib import Path

from lnk.errors import Refused
from lnk.payload.folders import folder_digest
from lnk.payload.hashcache import HashCache
from lnk.payload.receivers import Receiver
from lnk.payload.safefs import Conflict, dest_kind
from lnk.payload.staging import Stage


def held_whole(
    stage: Stage, r: Receiver, agent_root: Path
) -> tuple[int, list[list[str]], list[str]]:
    """The folders the stream says this machine holds whole, each checked now (at use,
    not only at prepare): the base's folder at that path still has that digest.

    Returns how many Home files they hold where they already are, the renames that put
    the others in what is staged, and their paths in the base (none of their files may
    be hard-linked elsewhere: they stay the agent's own)."""
    rows = stage.db.execute("SELECT path, sha FROM e WHERE kind='d' AND sha != '' ORDER BY i")
    same, adopt, whole = 0, [], []
    info = r.info()
    kept = rows.fetchall()
    walked: tuple[dict[str, str], dict[str, int]] | None = None
    if stage.base_now is not None:
        try:
            walked = stage.base_now.result() if kept else None
        except Exception:  # each folder is then walked on its own below
            walked = None
        finally:
            stage.base_now.cancel()
    for path, digest in kept:
        base, cache_path = info.get("base_root"), info.get("base_cache")
        if not base or not cache_path:
            raise Conflict(f"{path} is said to be held here whole, but nothing is held here")
        root = Path(base)
        dest_kind(root / path, root)  # no link above it
        if walked is not None:
            now, files = walked[0].get(path, ""), walked[1].get(path, 0)
        else:
            cache = HashCache(Path(cache_path), readonly=True)
            try:
                now, files = folder_digest(root, path, cache)
            finally:
                cache.close()
        if now != digest:
            raise Refused(
                f"{path} was to stay as this machine held it when the receiver was prepared "
                f"({root / path}), but it changed since",
                hint="nothing was applied; prepare a new receiver "
                "(lnk agent state-receive --prepare) and send again",
            )
        whole.append(str(root / path))
        if path == "Home" or path.startswith("Home/"):
            if root == agent_root:
                same += files  # in place already: nothing to do
            else:
                adopt.append([str(root / path), str(stage.work / "home" / path[5:])])
        else:
            adopt.append([str(root / path), str(stage.work / "agent" / path[len("Agent/") :])])
    return same, adopt, whole


def adopt_whole(renames: list[list[str]]) -> None:
    """Folders held here whole go into what is staged by one rename each.  Each is
    done once (a crash between two leaves some done: a source gone is done); where the
    staged folder exists already (a root such as Home/), what it lacks moves into it."""
    for src, dst in renames:
        if not os.path.lexists(src):
            continue
        if not os.path.lexists(dst):
            os.rename(src, dst)
            continue
        stack = [(src, dst)]
        while stack:
            s, d = stack.pop()
            with os.scandir(s) as it:
                for e in it:
                    t = os.path.join(d, e.name)
                    if not os.path.lexists(t):
                        os.rename(e.path, t)
                    elif e.is_dir(follow_symlinks=False) and dest_kind(Path(t), Path(dst)) == "d":
                        stack.append((e.path, t))
