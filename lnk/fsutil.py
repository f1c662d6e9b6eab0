"""Removing a tree of any depth, never following a link, never recursing.

``rmtree`` removes a tree iteratively, one folder descriptor at a time,
climbing back through ``..`` only after checking it is the folder it came
from; it never follows a link and never raises.  Python's ``shutil.rmtree``
recurses on depth, and an agent's tree may be thousands of folders deep.
"""

from __future__ import annotations

import contextlib
import os
import stat

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# ---- removing -------------------------------------------------------------------------------
def rmtree(path: str | os.PathLike[str]) -> bool:
    """Remove ``path`` (a file, a link or a whole tree) without following links, at any
    depth; what cannot be removed stays.  Never raises; True if ``path`` is gone."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(OSError):
            _empty(p, st)
        with contextlib.suppress(OSError):
            os.rmdir(p)
    else:
        with contextlib.suppress(OSError):
            os.unlink(p)
    return not os.path.lexists(p)


def _empty(top: str, top_st: os.stat_result) -> None:
    """Remove everything inside the folder ``top`` (iteratively, one descriptor)."""
    fd = os.open(top, _DIR)
    idents = [(top_st.st_dev, top_st.st_ino)]  # the folders from top down to fd's
    names: list[str] = []  # their names, below top
    failed: list[set[str]] = [set()]  # what could not go, per level
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != idents[0]:
            return
        while True:
            sub = _clear_files(fd, failed[-1])
            if sub is not None:
                try:
                    cfd = os.open(sub, _DIR, dir_fd=fd)
                except OSError:
                    failed[-1].add(sub)
                    continue
                cst = os.fstat(cfd)
                os.close(fd)
                fd = cfd
                idents.append((cst.st_dev, cst.st_ino))
                names.append(sub)
                failed.append(set())
                continue
            if not names:
                return
            name = names.pop()
            idents.pop()
            failed.pop()
            pfd = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = pfd
            pst = os.fstat(fd)
            if (pst.st_dev, pst.st_ino) != idents[-1]:
                return  # the tree was moved meanwhile: stop rather than delete elsewhere
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError:
                failed[-1].add(name)
    finally:
        os.close(fd)


def _clear_files(fd: int, failed: set[str]) -> str | None:
    """Unlink every non-folder in ``fd``; return the first folder left to clear, if any."""
    with os.scandir(fd) as it:
        for e in it:
            if e.name in failed:
                continue
            try:
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                return e.name
            try:
                os.unlink(e.name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                failed.add(e.name)
    return None
