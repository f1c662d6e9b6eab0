"""Applying a verified stream at once, and finishing an apply a crash interrupted.

Once everything is staged and verified, the receiver writes ``commit.json``:
from then on the apply is decided and rolls forward (here, or at the next
``lnk`` that finds the journal), never back.  Every step can run twice.

    1. the agent's state is replaced wholly: the old Agent/ is renamed aside
       and the staged one renamed into place
    2. its files are added to Home/: overwritten, never deleted
    3. Config/sandbox.toml and the settings file are replaced
    4. the receiver (its key, staged objects, the old Agent/) is deleted
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk.agents.layout import AGENT_COLLECTION_DIRS, Machine
from lnk.errors import Refused
from lnk.payload import safefs
from lnk.payload.receivers import Receiver
from lnk.payload.staging import Stage

JOURNAL = "commit.json"


class Conflict(Exception):
    pass


def _dest_kind(dest: Path, stop: Path) -> str | None:
    """What the destination holds at ``dest``: None, "f", "d"; raises Conflict on a link."""
    p = dest
    while True:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise Conflict(f"{p} is a symbolic link")
        if p == dest:
            kind = (
                None
                if st is None
                else ("d" if stat.S_ISDIR(st.st_mode) else "f" if stat.S_ISREG(st.st_mode) else "x")
            )
        if p == stop or p.parent == p:
            return kind
        p = p.parent


def materialize(stage: Stage, r: Receiver, agent_root: Path) -> int:
    """Build work/agent and work/home from the entries; returns how many Home files
    were already there as the stream has them (left alone)."""
    work = stage.work
    agent_dir, home_dir = work / "agent", work / "home"
    agent_dir.mkdir(exist_ok=True)
    home_dir.mkdir(exist_ok=True)
    discard = _discarded_roots(r, agent_root)
    assert stage.head is not None
    hashes = r.machine.runtime_dir(stage.head.agent_id) / "hashes.sqlite"
    group_targets: dict[int, Path] = {}  # hard-link groups only
    checked: list[str] = []  # folders of Home/ found link-free, along the current path
    same = 0
    for path, kind, mode, size, sha, grp, mtime in stage.iter_entries():
        if path == "Home" or path.startswith("Home/"):
            rel = path[5:]
            target = home_dir / rel if rel else home_dir
            dest = agent_root / "Home" / rel if rel else agent_root / "Home"
            where = str(dest)
            while checked and not where.startswith(checked[-1] + "/"):
                checked.pop()
            try:  # from the deepest folder checked already: linear in depth, not square
                have = _dest_kind(dest, Path(checked[-1]) if checked else agent_root)
            except Conflict as e:
                raise Conflict(f"{path}: {e}") from None
            if kind == "d" and have in (None, "d"):
                checked.append(where)
            if have is not None and have != kind:
                raise Conflict(
                    f"{path} is a {'folder' if kind == 'd' else 'file'} in the stream "
                    f"but {'a folder' if have == 'd' else 'something else'} here"
                )
            if (
                kind == "f"
                and have == "f"
                and grp is None
                and r.local_sha(path) == sha
                and _unchanged(agent_root, path, sha, hashes)
            ):
                same += 1
                continue
        else:
            target = agent_dir / path[len("Agent/") :]
        if kind == "d":
            target.mkdir(parents=True, exist_ok=True)
            os.chmod(target, mode)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if grp is not None and grp in group_targets:
            os.link(group_targets[grp], target)
            continue
        if size == 0:
            target.touch()
        else:
            _take(r, path, sha, target, discard)
        os.chmod(target, mode)
        os.utime(target, ns=(mtime, mtime))
        if grp is not None:
            group_targets[grp] = target
    for d in AGENT_COLLECTION_DIRS:
        (agent_dir / d).mkdir(exist_ok=True)
    return same


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


def _take(r: Receiver, path: str, sha: str, target: Path, discard: list[Path]) -> None:
    """Put the content ``sha`` for the entry ``path`` at ``target``, from where the receiver
    holds it: opened without following any link (a folder of the base swapped for a link
    since --prepare leads nowhere) and hashed again as it is read (a changed file is refused).

    Content under a discarded root (the receiver's objects, the agent's old Agent/, the
    folders it left here) is hard-linked when nothing else links it: the commit drops its
    old place, so no copy is needed.  A second file of the same content gets a copy.
    """
    where = r.held(sha)
    if where is None:
        raise Conflict(f"the content of {path} vanished from staging")
    root, rel = where
    own = root == r.objects  # verified as it arrived, in the receiver's private folder
    link = any((root / rel).is_relative_to(d) for d in discard)
    try:
        safefs.take(root, rel, target, sha, link=link, verify=not own)
    except safefs.Changed as e:
        raise Refused(
            f"the content of {path} was to come from {root / rel}, which this machine "
            f"held when the receiver was prepared, but {e}",
            hint="nothing was applied; prepare a new receiver "
            "(lnk agent state-receive --prepare) and send again",
        ) from None


def _unchanged(agent_root: Path, path: str, sha: str, hashes: Path) -> bool:
    """Whether the file ``path`` of the destination still holds ``sha`` (as indexed at
    prepare): the agent's SHA-256 cache says so for its stat now, or hashing it does."""
    try:
        st = os.lstat(agent_root / path)
        if hashes.exists():
            con = sqlite3.connect(f"file:{hashes}?mode=ro&immutable=1", uri=True)
            try:
                row = con.execute(
                    "SELECT size, mtime, ctime, ino, sha FROM h WHERE path=?", (path,)
                ).fetchone()
            finally:
                con.close()
            if row and tuple(row) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha):
                return True
        fd = safefs.open_under(agent_root, path)
        try:
            return safefs.sha256_fd(fd) == sha
        finally:
            os.close(fd)
    except (OSError, sqlite3.Error):
        return False


def decide(r: Receiver, plan: dict[str, Any]) -> None:
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
    work = r.dir / "work"
    for sub in ("", "Home", "Config"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    new_agent, old_agent = work / "agent", work / "agent-old"
    if new_agent.exists():
        if (root / "Agent").exists() and not old_agent.exists():
            os.rename(root / "Agent", old_agent)
        if not (root / "Agent").exists():
            os.rename(new_agent, root / "Agent")
    skipped = _merge_home(work / "home", root / "Home")
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


def _merge_home(src: Path, dest: Path) -> list[str]:
    """Move every staged file into Home, never following a link that appeared meanwhile.

    Folders are read entry by entry (``os.scandir``), never listed whole, so a folder
    of a million files costs no more memory than one of ten.
    """
    skipped: list[str] = []
    if not src.exists():
        return skipped
    stack = [Path()]
    while stack:
        rel = stack.pop()
        d = dest / rel
        try:
            if _dest_kind(d, d.parent if rel.parts else dest) is None:  # its folder was checked
                d.mkdir()
                os.chmod(d, stat.S_IMODE(os.stat(src / rel).st_mode))  # the mode travels
        except (Conflict, OSError):
            skipped.append(str(rel))
            continue
        with os.scandir(src / rel) as it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(rel / entry.name)
                    continue
                target = d / entry.name
                try:
                    if _dest_kind(target, d) not in (None, "f"):
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
