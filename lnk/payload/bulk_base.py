"""A first move's bulk, kept as the receiver's base.

A move to a machine that holds nothing of the agent sends the bulk into the
receiver's objects, and its final lists every file again: the destination then
places each in the pause, O(files held).  Instead, once the bulk is received (the
agent still answers where it is), its entries are placed into a tree in the
receiver's private folder (``bulk-base/``: Agent/..., Home/...), its files' SHA-256
remembered by their stat, and that tree indexed as the receiver's base, folders'
digests included, as a move back to a machine that kept the agent's folders is.
The final's inventory then names those folders, the sender sends an unchanged one
as one entry, and the commit renames it into place: the pause is O(what changed).

Only a receiver without a base keeps its bulk so (a machine that holds the agent
already, or its kept folders, builds on those).  Content the bulk could not settle
(a file that changed while it was read) is left out, so its folder's digest differs
and the final carries it.  Nothing here touches the agent's place: a failure fails
the bulk's receive, and the move is undone.
"""

from __future__ import annotations

from lnk.agents.layout import Machine
from lnk.payload import commit, safefs
from lnk.payload.local_index import index_local
from lnk.payload.placed import remember_placed
from lnk.payload.receivers import BULK_BASE, Receiver
from lnk.payload.staging import Stage

CACHE = "bulk-base.sqlite"


def keep_as_base(machine: Machine, r: Receiver, stage: Stage) -> None:
    """Place the bulk's entries into ``bulk-base/`` and make that the receiver's base."""
    assert stage.head is not None
    base, cache = r.dir / BULK_BASE, r.dir / CACHE
    safefs.rmtree(base)
    cache.unlink(missing_ok=True)
    if stage.unsettled:  # never placed: the final carries them
        stage.db.execute("CREATE TEMP TABLE unsettled (sha TEXT PRIMARY KEY)")
        stage.db.executemany(
            "INSERT OR IGNORE INTO unsettled VALUES (?)", ((s,) for s in stage.unsettled)
        )
        stage.db.execute("DELETE FROM e WHERE kind='f' AND sha IN (SELECT sha FROM unsettled)")
    commit.materialize(stage, r, machine.folders(stage.head.name).root)
    base.mkdir(mode=0o700)
    (stage.work / "agent").rename(base / "Agent")
    (stage.work / "home").rename(base / "Home")
    # every file is the tree's alone now (its link in objects dropped: that changes its
    # ctime), then remembered by its stat and indexed without reading a byte again
    safefs.rmtree(r.objects)
    r.objects.mkdir()
    remember_placed(stage, cache, base, [])
    index_local(r, base, cache)
    r.set_info(base_root=str(base), base_store=None, base_cache=str(cache))
