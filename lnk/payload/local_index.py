"""A receiver's index of what this machine holds of the agent (its *base*), and the
inventory it answers from it (docs/stream-format.md 7.7).

``local.sqlite`` in the receiver's folder, written once at prepare:

c (sha, path, rel)      each file of the base: its content, where it is, its path
d (rel, digest, n)      each folder with a digest; n: files and folders in it, any depth

With the sender's folder digests, the inventory names the folders both hold alike
(the outermost, of at most :data:`WHOLE_MAX` entries) and lists the content only of
the files outside them: read as ranges of the path index between the named folders,
so an unchanged agent's inventory reads a few rows, not one a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lnk.agents.stores import log_tails
from lnk.payload.cachedb import insert_rows
from lnk.payload.digests import index_tree
from lnk.payload.folders import WHOLE_MAX
from lnk.payload.hashcache import H2_COLUMNS, HashCache
from lnk.payload.inventory import Inventory, held_whole, sizes_of
from lnk.payload.kept import ChangeRecorder, record_changes
from lnk.payload.manifest import SHA_RE

if TYPE_CHECKING:
    from lnk.payload.receivers import Receiver


def index_local(r: Receiver, agent_root: Path, cache_path: Path, kept: bool = False) -> None:
    """Index the base's content (sha -> path) and its folders' digests (path -> digest)
    in one transaction; for a kept folder, note which files changed there since the
    move (lnk/payload/kept.py)."""
    con = sqlite3.connect(r.dir / "local.sqlite")
    cache = ChangeRecorder(cache_path) if kept else HashCache(cache_path)
    try:
        con.execute("CREATE TABLE IF NOT EXISTS c (sha TEXT, path TEXT, rel TEXT)")
        con.execute("CREATE TABLE IF NOT EXISTS d (rel TEXT PRIMARY KEY, digest TEXT, n INT)")
        con.execute("ATTACH DATABASE ? AS k", (str(cache_path),))  # (read: RowsFromCache)
        con.execute("BEGIN")  # one transaction: a folder's rows are a savepoint in it
        snap = r.dir / "snapshots"
        snap.mkdir(exist_ok=True)
        files: list[tuple[str, str, str]] = []

        def note(rows: list[tuple[str, str, str]]) -> None:
            files.extend(rows)
            if len(files) >= 5000:
                insert_rows(con, "INSERT INTO c", 3, files)
                files.clear()

        digests, counts = index_tree(agent_root, cache, snap, note, RowsFromCache(con))
        insert_rows(con, "INSERT INTO c", 3, files)
        folders = sizes_of(digests)  # the folders with a digest inside each
        con.executemany(
            "INSERT OR REPLACE INTO d VALUES (?,?,?)",
            ((p, d, counts.get(p, 0) + folders.get(p, 0)) for p, d in digests.items()),
        )
        # indexed once filled: one sort each, not a b-tree kept sorted row by row
        con.execute("CREATE INDEX IF NOT EXISTS c_sha ON c(sha)")
        con.execute("CREATE INDEX IF NOT EXISTS c_rel ON c(rel)")
        if isinstance(cache, ChangeRecorder):
            record_changes(con, cache.changed)
        con.commit()
    finally:
        cache.close()
        con.close()


class RowsFromCache:
    """A remembered folder's files into the index straight from the hash cache's rows
    (attached as ``k``), one statement a folder: ``digests.CacheRows``.

    Made inside the index's transaction: what it sees of the cache's table then is what
    every later statement of the transaction sees (one read snapshot)."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con
        # the file lies in a person's folder: a table other than lnk's may hold two rows
        # for one name and none for another, or match a name other than the one asked
        # (a column of another collation or type: "a.txt" for "A.txt", 1 for "01"), so
        # there each row is the name asked exactly and one a name; lnk's own table has
        # one row a name, matched as named, and leaves the grouping out (a third of the
        # statement's time)
        if _lnks_own(con):
            self.statement = (
                "INSERT INTO c SELECT sha, ?1 || name, ?2 || name FROM k.h2 "
                "WHERE dir = ?3 AND name IN (SELECT value FROM json_each(?4))"
            )
        else:
            self.statement = (
                "INSERT INTO c SELECT MIN(sha), ?1 || name, ?2 || name FROM k.h2 "
                "WHERE dir = ?3 AND name IN (SELECT value FROM json_each(?4)) "
                "AND typeof(dir) = 'text' AND dir COLLATE BINARY = ?3 "
                "AND typeof(name) = 'text' AND name COLLATE BINARY IN "
                "(SELECT value FROM json_each(?4)) GROUP BY name"
            )

    def __call__(self, rel: str, path: str, names: list[str]) -> bool:
        if not names:
            return True
        con = self.con
        con.execute("SAVEPOINT folder")
        try:
            taken = con.execute(
                self.statement, (path + "/", rel + "/", rel, json.dumps(names))
            ).rowcount
        except sqlite3.DatabaseError:  # a cache without rows, locked or damaged: read it
            taken = -1
        if taken != len(names):
            con.execute("ROLLBACK TO folder")
        con.execute("RELEASE folder")
        return taken == len(names)


def _lnks_own(con: sqlite3.Connection) -> bool:
    """Whether the attached cache's ``h2`` is the table lnk makes (``H2_COLUMNS``, as
    SQLite keeps its statement): its key (dir, name), both binary text."""
    try:
        got = con.execute(
            "SELECT sql FROM k.sqlite_master WHERE type = 'table' AND name = 'h2'"
        ).fetchone()
    except sqlite3.DatabaseError:
        return False
    return got is not None and got[0] == f"CREATE TABLE h2 {H2_COLUMNS}"


def _staged(r: Receiver) -> Iterator[str]:
    """The digests of the content staged in the receiver's objects, one at a time."""
    if r.objects.exists():
        with os.scandir(r.objects) as it:
            yield from (e.name for e in it if SHA_RE.fullmatch(e.name))


def holds(r: Receiver) -> int:
    """How many distinct contents the receiver holds (its objects, its base's files as
    indexed): ``len(inventory(r))``, counted in SQL (memory bounded: an interrupted
    receiver's million staged objects, adopted, are not a list)."""
    db = r.dir / "local.sqlite"
    if not db.exists():
        return sum(1 for _ in _staged(r))
    con = sqlite3.connect(db)
    try:
        con.execute("CREATE TEMP TABLE staged (sha TEXT PRIMARY KEY) WITHOUT ROWID")
        con.executemany("INSERT OR IGNORE INTO staged VALUES (?)", ((s,) for s in _staged(r)))
        try:
            got = con.execute(
                "SELECT (SELECT COUNT(DISTINCT sha) FROM c) "
                "+ (SELECT COUNT(*) FROM staged WHERE sha NOT IN (SELECT sha FROM c))"
            )
        except sqlite3.OperationalError:  # no index of a base yet
            got = con.execute("SELECT COUNT(*) FROM staged")
        return int(got.fetchone()[0])
    finally:
        con.close()


def inventory(r: Receiver, against: dict[str, str] | None = None, at: int = 0) -> Inventory:
    """What the receiver holds.  ``against`` the sender's folder digests
    (:class:`lnk.protocol.StateDigests`), a folder held whole with the sender's digest
    (and small enough that the sender surely keeps it whole, :data:`WHOLE_MAX`) is
    listed as that one folder, and none of the content inside it (the sender sends it
    as one entry); everything else as without (docs/stream-format.md 7.7).  ``at``:
    when the sender took those digests (its ``StateDigests.at``), given back."""
    dirs: dict[str, str] = {}
    db = r.dir / "local.sqlite"
    # the digests gathered in a table and read back in order: memory bounded whatever
    # the number of files (a million: 32 MB of digests, not a million strings)
    con = sqlite3.connect(db if db.exists() else ":memory:")
    try:
        con.execute("CREATE TEMP TABLE held (sha TEXT PRIMARY KEY) WITHOUT ROWID")
        con.executemany("INSERT OR IGNORE INTO held VALUES (?)", ((s,) for s in _staged(r)))
        if db.exists():
            sizes: dict[str, int] = {}
            with contextlib.suppress(sqlite3.OperationalError):
                for rel, digest, n in con.execute("SELECT rel, digest, n FROM d"):
                    # (a size that is no number: too big to name)
                    dirs[rel] = digest
                    sizes[rel] = n if isinstance(n, int) else WHOLE_MAX + 1
            if against is None:
                con.execute("INSERT OR IGNORE INTO held SELECT sha FROM c")
            else:
                dirs = held_whole(dirs, against, sizes, WHOLE_MAX)
                con.executemany("INSERT OR IGNORE INTO held VALUES (?)", _outside(con, dirs))
        blob = bytearray()
        for (sha,) in con.execute("SELECT sha FROM held ORDER BY sha"):
            if isinstance(sha, str) and SHA_RE.fullmatch(sha):
                blob += bytes.fromhex(sha)
    finally:
        con.close()
    inv = Inventory(bytes(blob))
    inv.dirs = dirs
    inv.at = at if against is not None else 0
    base = base_chats(r)
    if base is not None:
        inv.logs = log_tails(*base)
    return inv


def _outside(con: sqlite3.Connection, named: dict[str, str]) -> Iterator[tuple[str]]:
    """The content of the files inside none of the ``named`` folders (none inside
    another): the path index read between them.  A path inside ``p`` is one from
    ``p/`` up to ``p0`` (``0`` follows ``/``), so the named folders, ordered by that
    bound, leave ranges between them that hold everything else."""
    low = ""
    for p in sorted(named, key=lambda p: p + "/"):
        yield from con.execute("SELECT sha FROM c WHERE rel >= ? AND rel < ?", (low, p + "/"))
        low = p + "0"
    yield from con.execute("SELECT sha FROM c WHERE rel >= ?", (low,))


def base_chats(r: Receiver) -> tuple[Path, str] | None:
    """The store a stream's logs may build on (the receiver's inventory says how far)."""
    info = r.info()
    root, store = info.get("base_root"), info.get("base_store")
    if not root or store not in ("files", "sqlite"):
        return None
    chats = Path(root) / "Agent" / "chats"
    return (chats, str(store)) if chats.is_dir() else None
