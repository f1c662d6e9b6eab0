"""A SQLite database of the agent's, read as the very file a walk found.

SQLite opens a database by a path of its own, and the agent may swap a folder of
its own for a link (``pinned.py``).  So SQLite is given a private hard link to the
walked file (and to its sidecars as they are), made from its folder's descriptor
without following a link, in a folder of lnk's own; the sidecars beside the
database are checked to be the same after the snapshot (a writer that made a log
of its own meanwhile voids it).  Where no hard link can be made (that folder on
another file system), the path is checked to lead to the walked file, through
folders only, before and after the snapshot.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
from pathlib import Path

from lnk.payload.pinned import SQLITE_SIDECARS, Ident, ident, leads_to, root_of
from lnk.payload.safefs import open_parent, rmtree


class _Pin:
    """A private folder in ``into`` holding ``db``, a hard link to the very file a walk
    found, and links to its sidecars as they are now, all made from the file's folder's
    descriptor (held open).  ``state``: "pinned", "elsewhere" (no link can be made
    there: another file system) or "changed" (the file is no longer the walk's)."""

    def __init__(self, source: str | Path, rel: str, st: os.stat_result, into: Path) -> None:
        self.dir: Path | None = None
        self.sides: dict[str, Ident | None] = {}
        self.dfd = -1
        try:
            self.dfd, self.name = open_parent(root_of(source, rel), rel)
        except OSError:
            self.state = "changed"
            return
        try:
            self.dir = Path(tempfile.mkdtemp(prefix="pin-", dir=into))
            self.state = self._link(st)
        except BaseException:
            self.close()
            raise

    def _link(self, st: os.stat_result) -> str:
        assert self.dir is not None
        try:
            # (no AT_SYMLINK_FOLLOW: a link swapped in is linked as the link it is)
            os.link(self.name, self.dir / "db", src_dir_fd=self.dfd, follow_symlinks=False)
        except FileNotFoundError:
            return "changed"
        except (OSError, NotImplementedError):  # (no linkat on this system)
            return "elsewhere"
        if ident(os.lstat(self.dir / "db")) != ident(st):
            return "changed"
        for s in SQLITE_SIDECARS:
            try:
                os.link(
                    self.name + s, self.dir / f"db{s}", src_dir_fd=self.dfd, follow_symlinks=False
                )
            except FileNotFoundError:
                self.sides[s] = None
                continue
            except OSError:
                return "elsewhere"  # a sidecar it cannot see would be a snapshot without it
            got = os.lstat(self.dir / f"db{s}")
            self.sides[s] = ident(got)
            if not stat.S_ISREG(got.st_mode):
                os.unlink(self.dir / f"db{s}")  # a link is never followed
        return "pinned"

    def same_sidecars(self) -> bool:
        """Whether the sidecars beside the database are still those linked (a writer that
        made a log of its own meanwhile may have changed pages SQLite read here)."""
        for s, was in self.sides.items():
            try:
                now: Ident | None = ident(
                    os.stat(self.name + s, dir_fd=self.dfd, follow_symlinks=False)
                )
            except FileNotFoundError:
                now = None
            except OSError:
                return False
            if now != was:
                return False
        return True

    def close(self) -> None:
        if self.dir is not None:
            rmtree(self.dir)
        if self.dfd >= 0:
            os.close(self.dfd)


def copy_database(source: str | Path, dest: Path, read_only: bool = True) -> None:
    """A consistent copy of the database at ``source`` into ``dest``, through SQLite's
    online backup API (``read_only=False``: a journal left beside it is rolled back
    first).  Raises ``sqlite3.Error``."""
    src = (
        sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        if read_only
        else sqlite3.connect(source)
    )
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


def _backup(db: str | Path, into: Path) -> Path | None:
    fd, name = tempfile.mkstemp(prefix="snap-", suffix=".sqlite", dir=into)
    os.close(fd)
    dest = Path(name)
    try:
        copy_database(db, dest)
    except sqlite3.Error:
        dest.unlink(missing_ok=True)
        return None
    return dest


def sqlite_snapshot(
    path: str | Path, into: Path, rel: str = "", st: os.stat_result | None = None
) -> Path | None:
    """A consistent copy of a live database in ``into``, through SQLite's online backup
    API; None when SQLite cannot read it as one (a damaged file that only starts like a
    database, or a sidecar name taken by a folder), or when it is no longer the file a
    walk found at ``rel`` (``st``): such a file travels as its bytes, read as any other.

    With ``rel`` and ``st``, SQLite reads the very file the walk found (see the module's
    docstring); without them, the file at ``path``."""
    if not rel or st is None:
        return _backup(path, into)
    pin = _Pin(path, rel, st, into)
    try:
        if pin.state == "changed":
            return None
        if pin.state == "pinned":
            assert pin.dir is not None
            snap = _backup(pin.dir / "db", into)
            if snap is not None and not pin.same_sidecars():
                snap.unlink()
                return None
            return snap
    finally:
        pin.close()
    if not leads_to(path, rel, st):
        return None
    snap = _backup(path, into)
    if snap is not None and not leads_to(path, rel, st):
        snap.unlink(missing_ok=True)
        return None
    return snap
