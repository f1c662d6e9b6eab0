"""Applying a verified stream at once, and finishing an apply a crash interrupted.

Once everything is staged and verified, the receiver writes ``commit.json``:
from then on the apply is decided and rolls forward (here, or at the next
``lnk`` that finds the journal), never back.  Every step can run twice.

    1. the agent's state is replaced wholly: the old Agent/ is renamed aside
       and the staged one renamed into place
    2. its files are added to Home/: overwritten, never deleted
    3. Config/sandbox.toml and the settings file are replaced (a move's final first
       writes the hold on the agent's connections: ``<runtime>/connections.hold``)
    4. the receiver (its key, staged objects, the old Agent/) is deleted
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk.agents.layout import AGENT_COLLECTION_DIRS, Machine
from lnk.errors import Refused
from lnk.payload import manifest as M
from lnk.payload import safefs
from lnk.payload.receivers import Receiver
from lnk.payload.safefs import Conflict, dest_kind
from lnk.payload.staging import Stage
from lnk.payload.whole import adopt_whole, held_whole

JOURNAL = "commit.json"


# what may take a place the destination holds: a file or a link is renamed over a file
# or a link (the name is replaced, nothing is written through it); a folder only a folder
_REPLACEABLE = {("f", "f"), ("d", "d"), ("l", "l"), ("f", "l"), ("l", "f")}


def materialize(stage: Stage, r: Receiver, agent_root: Path) -> tuple[int, list[list[str]]]:
    """Build work/agent and work/home from the entries; returns how many Home files
    were already there as the stream has them (left alone), and the folders held here
    whole that the apply renames into what is staged (``[from, to]``)."""
    work = stage.work
    agent_dir, home_dir = work / "agent", work / "home"
    agent_dir.mkdir(exist_ok=True)
    home_dir.mkdir(exist_ok=True)
    discard = [f"{d}/" for d in _discarded_roots(r, agent_root)]
    same, adopt, whole = held_whole(stage, r, agent_root)
    assert stage.head is not None
    hashes = r.machine.runtime_dir(stage.head.agent_id) / "hashes.sqlite"
    cache_db = _open_cache(hashes)
    group_targets: dict[int, str] = {}  # hard-link groups only
    safe: set[str] = set()  # destination folders seen to be folders, not links
    missing: set[str] = set()  # destination folders seen not to be there
    made: set[str] = set()  # staged folders made (or seen made) by this loop
    home_s, agent_s, root_home = str(home_dir), str(agent_dir), str(agent_root / "Home")
    # no Home here (a restore on a new machine): nothing below it to meet, once the
    # folders above it are seen not to be links
    home_here = os.path.lexists(root_home)
    if not home_here:
        dest_kind(root_home, agent_root, safe, missing)
    for path, kind, mode, size, sha, grp, mtime, placed in stage.iter_entries():
        if kind == "d" and sha:
            continue  # held here whole (checked above)
        if path == "Home" or path.startswith("Home/"):
            rel = path[5:]
            target = f"{home_s}/{rel}" if rel else home_s
            dest = f"{root_home}/{rel}" if rel else root_home
            try:
                have = dest_kind(dest, agent_root, safe, missing) if home_here else None
            except Conflict as e:
                raise Conflict(f"{path}: {e}") from None
            if have is not None and (kind, have) not in _REPLACEABLE:
                what = {"d": "a folder", "f": "a file", "l": "a symbolic link"}
                raise Conflict(
                    f"{path} is {what[kind]} in the stream "
                    f"but {what.get(have, 'something else')} here"
                )
            if (
                kind == "f"
                and have == "f"
                and grp is None
                and r.local_sha(path) == sha
                and _same_meta(dest, mode, mtime)
                and _unchanged(agent_root, path, sha, cache_db)
            ):
                same += 1
                if placed:  # left alone: what arrived is not needed
                    os.unlink(target)
                continue
        else:
            target = f"{agent_s}/{path[len('Agent/') :]}"
        if kind == "d":
            os.makedirs(target, exist_ok=True)
            os.chmod(target, mode)
            made.add(target)
            continue
        if placed:  # its bytes, mode and mtime were written as they arrived
            if grp is not None:
                group_targets[grp] = target
            continue
        parent = target.rpartition("/")[0]
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        if kind == "l":  # its target is text: never followed, never checked
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
            os.symlink(sha, target)
            continue
        if grp is not None and grp in group_targets:
            os.link(group_targets[grp], target)
            continue
        if size == 0:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        else:
            _take(r, path, sha, target, discard, whole)
        os.chmod(target, mode)
        os.utime(target, ns=(mtime, mtime))
        if grp is not None:
            group_targets[grp] = target
    for d in AGENT_COLLECTION_DIRS:
        (agent_dir / d).mkdir(exist_ok=True)
    if cache_db is not None:
        cache_db.close()
    return same, adopt


def _same_meta(dest: Path | str, mode: int, mtime: int) -> bool:
    """The file there has the stream's mode and mtime (its content is known to match)."""
    try:
        st = os.lstat(dest)
    except OSError:
        return False
    return stat.S_IMODE(st.st_mode) == mode and st.st_mtime_ns == mtime


def _discarded_roots(r: Receiver, agent_root: Path) -> list[Path]:
    """Where content may be hard-linked from because the commit discards it: the
    receiver's objects, the live agent's old Agent/ (swapped out), and the folders
    an agent left here when it moved away (it is back: they go at the commit)."""
    roots = [r.objects]
    base = r.info().get("base_root")
    if base:
        b = Path(base)
        roots.append(b / "Agent" if b == agent_root else b)
    return roots


def _take(
    r: Receiver, path: str, sha: str, target: str, discard: list[str], whole: set[str]
) -> None:
    """Put the content ``sha`` for the entry ``path`` at ``target``, from where the receiver
    holds it: opened without following any link (a folder of the base swapped for a link
    since --prepare leads nowhere) and hashed again as it is read (a changed file is refused).

    Content under a discarded root (``discard``: each ends with ``/``; the receiver's
    objects, the agent's old Agent/, the folders it left here) is hard-linked when
    nothing else links it: the commit drops its old place, so no copy is needed.  A
    second file of the same content gets a copy.
    """
    if _link_own(r, sha, target):
        return
    where = r.held(sha)
    if where is None:
        raise Conflict(f"the content of {path} vanished from staging")
    root, rel = where
    own = root is r.objects  # verified as it arrived, in the receiver's private folder
    # never a hard link into a folder kept whole: its files stay the agent's own
    full = f"{root}/{rel}"
    link = any(full.startswith(d) for d in discard) and not M.under(full, whole)
    try:
        safefs.take(root, rel, target, sha, link=link, verify=not own)
    except safefs.Changed as e:
        raise Refused(
            f"the content of {path} was to come from {root / rel}, which this machine "
            f"held when the receiver was prepared, but {e}",
            hint="nothing was applied; prepare a new receiver "
            "(lnk agent state-receive --prepare) and send again",
        ) from None


def _link_own(r: Receiver, sha: str, target: str) -> bool:
    """The common case of :func:`_take` in three system calls: content in the receiver's
    own objects (verified as it arrived, dropped at the commit) that nothing else links
    is hard-linked at ``target``, which is then checked to be that very file (a link
    swapped in between is undone).  False: nothing was done, the general way follows."""
    src = f"{r.objects_s}/{sha}"
    try:
        st = os.lstat(src)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return False
        os.link(src, target, follow_symlinks=False)
    except OSError:
        return False
    lt = os.lstat(target)
    if (lt.st_dev, lt.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(lt.st_mode):
        os.unlink(target)
        return False
    return True


def _open_cache(hashes: Path) -> sqlite3.Connection | None:
    """The agent's SHA-256 cache, read-only, opened once for a whole commit."""
    if not hashes.exists():
        return None
    try:
        return sqlite3.connect(f"file:{hashes}?mode=ro", uri=True)
    except sqlite3.Error:
        return None


def _unchanged(agent_root: Path, path: str, sha: str, cache: sqlite3.Connection | None) -> bool:
    """Whether the file ``path`` of the destination still holds ``sha`` (as indexed at
    prepare): the agent's SHA-256 cache says so for its stat now, or hashing it (opened
    without following any link) does."""
    try:
        st = os.lstat(agent_root / path)
        if cache is not None:
            d, _, name = path.rpartition("/")
            try:
                row = cache.execute(
                    "SELECT size, mtime, ctime, ino, sha FROM h2 WHERE dir=? AND name=?",
                    (d, name),
                ).fetchone()
            except sqlite3.Error:
                row = None
            if row and tuple(row) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha):
                return True
        fd = safefs.open_under(agent_root, path)
        try:
            return safefs.sha256_fd(fd) == sha
        finally:
            os.close(fd)
    except OSError:
        return False


def _syncfs(fd: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.syncfs(fd) == 0)
    except (OSError, AttributeError):
        return False


def sync_staged(r: Receiver) -> None:
    """Everything staged reaches the disk before the journal says it is decided: one
    syncfs of the receiver's file system (every file staged, at once), never an fsync
    per file; a whole-system sync where syncfs is missing."""
    fd = os.open(r.dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not _syncfs(fd):
            os.sync()
    finally:
        os.close(fd)


def decide(r: Receiver, plan: dict[str, Any]) -> None:
    sync_staged(r)
    tmp = r.dir / (JOURNAL + ".tmp")
    with open(tmp, "w") as f:
        json.dump(plan, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, r.dir / JOURNAL)


def apply(r: Receiver, before_cleanup: Callable[[list[str]], None] | None = None) -> dict[str, Any]:
    """Roll a decided commit forward; safe to run again after a crash at any point.

    ``before_cleanup`` runs once everything is in place, before the receiver goes.
    """
    plan = json.loads((r.dir / JOURNAL).read_text())
    root = Path(plan["agent_root"])
    if plan.get("hold"):  # before the settings exist here: no bridge acts meanwhile
        _hold(Path(plan["hold"]))
    work = r.dir / "work"
    for sub in ("", "Home", "Config"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    new_agent, old_agent = work / "agent", work / "agent-old"
    not_taken: list[str] = []
    if new_agent.exists():
        not_taken = adopt_whole(plan.get("adopt") or [])
        if (root / "Agent").exists() and not old_agent.exists():
            os.rename(root / "Agent", old_agent)
        if not (root / "Agent").exists():
            os.rename(new_agent, root / "Agent")
    # what could not be reached without following a link is reported, Home-relative
    skipped = [p[5:] if p.startswith("Home/") else p for p in not_taken]
    skipped += _merge_home(work / "home", root / "Home")
    if (work / "sandbox.toml").exists():
        os.replace(work / "sandbox.toml", root / "Config" / "sandbox.toml")
    if (work / "settings.toml").exists():
        Path(plan["settings_file"]).parent.mkdir(parents=True, exist_ok=True)
        os.replace(work / "settings.toml", plan["settings_file"])
    moved_note = plan.get("moved_note")
    if moved_note:
        Path(moved_note).unlink(missing_ok=True)
    kept = plan.get("drop_kept")
    if kept:  # the agent is back: the folders it left here are in it again
        safefs.rmtree(kept)
    # the apply is done: nothing below may make it look failed
    if before_cleanup is not None:
        # what goes first: dropping a hard link changes the ctime of the file it shared
        safefs.rmtree(r.objects)
        safefs.rmtree(old_agent)
        with contextlib.suppress(Exception):  # a cache of SHA-256s: losing it costs time
            before_cleanup(skipped)
    r.abandon()
    return {"skipped": skipped}


def _hold(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "w") as f:
        f.write("held by a move until the copy where it was is gone\n")
        f.flush()
        os.fsync(f.fileno())


def _merge_home(src: Path, dest: Path) -> list[str]:
    """Move every staged file into Home, never following a link that appeared meanwhile.

    Folders are read entry by entry (``os.scandir``), never listed whole, so a folder
    of a million files costs no more memory than one of ten.
    """
    skipped: list[str] = []
    safe: set[str] = set()  # destination folders seen to be folders, not links
    if not src.exists():
        return skipped
    stack = [Path()]
    while stack:
        rel = stack.pop()
        d = dest / rel
        try:
            have = dest_kind(d, dest, safe)
            if have is None:
                d.mkdir()
                os.chmod(d, stat.S_IMODE(os.stat(src / rel).st_mode))  # the mode travels
            elif have != "d":  # a link (never written through) or something else
                raise Conflict("not a folder")
        except (Conflict, OSError):
            skipped.append(str(rel))
            continue
        with os.scandir(src / rel) as it:
            for entry in it:
                target = d / entry.name
                if entry.is_dir(follow_symlinks=False):
                    try:
                        missing = dest_kind(target, dest, safe) is None
                    except Conflict:
                        missing = False
                    if missing:  # not there at all: the whole folder goes in one rename
                        with contextlib.suppress(OSError):
                            os.rename(entry.path, target)
                            continue
                    stack.append(rel / entry.name)
                    continue
                try:
                    # a file or link renamed over a file or link: the name is
                    # replaced, nothing is written through a link
                    if dest_kind(target, dest, safe) not in (None, "f", "l"):
                        raise Conflict("not a file")
                    os.replace(entry.path, target)
                except (Conflict, OSError):
                    skipped.append(str(rel / entry.name))
    return skipped


def finish_pending(machine: Machine) -> list[str]:
    """Finish applies a crash left decided; returns the agents they were for."""
    done: list[str] = []
    root = machine.receivers_dir
    if not root.is_dir():
        return done
    for d in sorted(root.iterdir()):
        if (d / JOURNAL).exists():
            plan = json.loads((d / JOURNAL).read_text())
            apply(Receiver(machine, d.name))
            done.append(str(plan.get("name")))
    return done
