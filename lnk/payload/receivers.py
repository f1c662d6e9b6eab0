"""One-time receivers: ``~/.lnk/receivers/<receiver>/``.

key             the receiver's private key seed, mode 0600, deleted at commit or abandon
receiver.json   when it was made, for which agent, the bulk phase it holds
local.sqlite    content this machine already holds for that agent: sha256 -> path
objects/<sha>   verified content staged by streams to this receiver
bulk/           what a verified bulk phase left for its final phase
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnk.agents.layout import Machine
from lnk.agents.machine import now as clock
from lnk.agents.moved import notes_dir
from lnk.agents.moved import purge_expired as purge_moved
from lnk.agents.registry import find, find_by_id
from lnk.agents.stores import detect_driver
from lnk.errors import AlreadyExists, InvalidInput, NotFound, Refused
from lnk.formats.keys import ReceiverKey
from lnk.payload import local_index, safefs
from lnk.payload.inventory import Inventory
from lnk.payload.manifest import SHA_RE

RECEIVER_PREFIX = "rcv-"
BULK_BASE = "bulk-base"  # a first move's bulk, kept as the receiver's base (bulk_base.py)
MAX_AGE_S = 24 * 3600  # a receiver is refused, and its key deleted, after 24 hours


@dataclass
class Receiver:
    machine: Machine
    rid: str
    _con: sqlite3.Connection | None = field(default=None, repr=False, compare=False)
    _info: tuple[tuple[int, int, int, int], dict[str, Any]] | None = field(
        default=None, repr=False, compare=False
    )

    @functools.cached_property
    def dir(self) -> Path:
        """(made once: a commit asks for it once a file)"""
        return self.machine.receivers_dir / self.rid

    @functools.cached_property
    def objects(self) -> Path:
        return self.dir / "objects"

    @property
    def bulk(self) -> Path:
        return self.dir / "bulk"

    @functools.cached_property
    def objects_s(self) -> str:
        """``objects`` as a string, made once (a receive looks there once a file)."""
        return str(self.objects)

    def key(self) -> ReceiverKey:
        try:
            return ReceiverKey.from_seed((self.dir / "key").read_bytes())
        except FileNotFoundError:
            raise NotFound(
                f"the receiver {self.rid} has no key here (committed or abandoned)",
                hint="prepare a new receiver: lnk agent state-receive --prepare",
            ) from None

    def info(self) -> dict[str, Any]:
        """``receiver.json``, read again only when its stat changed (a receive asks for
        the base's place once a file held there); a copy, for the caller to keep."""
        path = f"{self.dir}/receiver.json"
        try:
            st = os.stat(path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if self._info is None or self._info[0] != key:
                with open(path, encoding="utf-8") as f:
                    data = json.loads(f.read())
                self._info = (key, data if isinstance(data, dict) else {})
        except (OSError, ValueError):
            return {}
        return dict(self._info[1])

    def set_info(self, **kw: Any) -> None:
        data = self.info() | kw
        tmp = self.dir / "receiver.json.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.dir / "receiver.json")

    def index_db(self) -> sqlite3.Connection | None:
        """One connection to what this machine holds (sha -> path), opened once."""
        if self._con is None:
            db = self.dir / "local.sqlite"
            if not db.exists():
                return None
            self._con = sqlite3.connect(db, check_same_thread=False)
        return self._con

    def held(self, sha: str) -> tuple[Path, str] | None:
        """Where content with this SHA-256 is held, as (a folder, a path below it): the
        receiver's own objects, a snapshot it took, or a file of the base as indexed at
        prepare.  The caller opens it with ``safefs`` (no link followed) and hashes it."""
        if os.path.isfile(f"{self.objects_s}/{sha}"):
            return self.objects, sha
        con = self.index_db()
        if con is None:
            return None
        row = con.execute("SELECT path, rel FROM c WHERE sha=?", (sha,)).fetchone()
        if row is None:
            return None
        where = self._where(str(row[0]), str(row[1]), self.info().get("base_root"))
        return None if where is None else (Path(where[0]), where[1])

    def _where(self, path: str, rel: str, base: str | None) -> tuple[str, str] | None:
        """An index row's file as (a folder, a path below it), if it is one a receiver
        may take: a file of the base, or a snapshot in the receiver's own folder."""
        if base and path == f"{base}/{rel}":  # (as the index wrote it: compared as text)
            return base, rel
        inside = f"{self.dir}/"
        if path.startswith(inside) and len(path) > len(inside):  # a snapshot taken at prepare
            return str(self.dir), path[len(inside) :]
        return None

    def held_among(self, shas: list[str]) -> set[str]:
        """Which of ``shas`` :meth:`held` finds, asked in one query, not one a file (a
        final that names thousands of files unchanged in a folder held whole)."""
        asked = set(shas)  # (a content many entries share: looked for once)
        found = {sha for sha in asked if os.path.isfile(f"{self.objects_s}/{sha}")}
        con = self.index_db()
        rest = list(asked - found)
        if con is None or not rest:
            return found
        base = self.info().get("base_root")
        rows = con.execute(
            "SELECT sha, path, rel FROM c WHERE sha IN (SELECT value FROM json_each(?))",
            (json.dumps(rest),),
        )
        found.update(str(sha) for sha, path, rel in rows if self._where(path, rel, base))
        return found

    def base_files(self) -> Iterator[tuple[str, str]]:
        """(SHA-256, path) of each regular file of the receiver's own base, as indexed
        (only there: never a file of a person's folder), one at a time."""
        con = self.index_db()
        if con is None or not self.own_base():
            return
        inside = str(self.dir / BULK_BASE) + "/"
        for sha, path in con.execute("SELECT sha, path FROM c"):
            sha, path = str(sha), str(path)
            # (no "..": only inside it)
            if path.startswith(inside) and os.path.normpath(path) == path and SHA_RE.fullmatch(sha):
                yield sha, path

    def local_sha(self, rel: str) -> str | None:
        """The SHA-256 of the file at ``rel`` in the base, as indexed at prepare."""
        con = self.index_db()
        row = (
            None if con is None else con.execute("SELECT sha FROM c WHERE rel=?", (rel,)).fetchone()
        )
        return str(row[0]) if row else None

    def own_base(self) -> bool:
        """Whether the base is the receiver's own (a bulk it kept: lnk/payload/bulk_base.py),
        in its private folder, where nothing but this receiver writes."""
        return self.info().get("base_root") == str(self.dir / BULK_BASE)

    def indexed_digests(self) -> dict[str, str]:
        """Every folder digest of the base, as indexed (path -> digest)."""
        con = self.index_db()
        if con is None:
            return {}
        try:
            return {str(rel): str(d) for rel, d in con.execute("SELECT rel, digest FROM d")}
        except sqlite3.OperationalError:
            return {}

    def dir_digest(self, rel: str) -> str | None:
        """The digest of the base's folder at ``rel``, as indexed at prepare."""
        con = self.index_db()
        if con is None:
            return None
        try:
            row = con.execute("SELECT digest FROM d WHERE rel=?", (rel,)).fetchone()
        except sqlite3.OperationalError:  # indexed before folders had digests
            return None
        return str(row[0]) if row else None

    def inventory_dirs(self) -> int:
        """How many folders of the base have a digest (as indexed at prepare)."""
        con = self.index_db()
        if con is None:
            return 0
        try:
            return int(con.execute("SELECT COUNT(*) FROM d").fetchone()[0])
        except sqlite3.OperationalError:
            return 0

    def holds(self) -> int:
        """How many distinct contents this receiver holds (its objects and its base's
        files as indexed): what ``len(self.inventory())`` is, counted, not listed."""
        return local_index.holds(self)

    def inventory(self, against: dict[str, str] | None = None, at: int = 0) -> Inventory:
        """What this receiver holds (:func:`lnk.payload.local_index.inventory`)."""
        return local_index.inventory(self, against, at)

    def abandon(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
        safefs.rmtree(self.dir)


def check_receiver_id(rid: str) -> str:
    if not (
        rid.startswith(RECEIVER_PREFIX) and rid[len(RECEIVER_PREFIX) :].isalnum() and len(rid) <= 40
    ):
        raise InvalidInput(
            f"{rid!r} is not a receiver",
            hint="use the receiver that lnk agent state-receive --prepare printed",
        )
    return rid


def open_receiver(machine: Machine, rid: str) -> Receiver:
    r = Receiver(machine, check_receiver_id(rid))
    if not r.dir.is_dir():
        raise NotFound(
            f"no receiver {rid} on this machine (committed, abandoned or never made)",
            hint="prepare a new one: lnk agent state-receive --prepare",
        )
    if _expired(r):
        r.abandon()
        raise Refused(
            f"the receiver {rid} was made more than 24 hours ago; it is refused and its "
            "key deleted",
            hint="prepare a new one: lnk agent state-receive --prepare",
        )
    return r


def _expired(r: Receiver) -> bool:
    """Older than 24 hours, and not decided (a decided apply always rolls forward)."""
    if (r.dir / "commit.json").exists():
        return False
    created = r.info().get("created")
    if not isinstance(created, (int, float)):
        try:
            created = r.dir.stat().st_mtime
        except OSError:
            return False
    return bool(clock() - created > MAX_AGE_S)


def purge_expired(machine: Machine) -> list[str]:
    """Delete every receiver older than 24 hours, and the kept folders of agents that
    moved away whose keep_moved is over: lnk runs this at each move, receive and start."""
    gone: list[str] = []
    root = machine.receivers_dir
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.name.startswith(RECEIVER_PREFIX) and d.is_dir():
                r = Receiver(machine, d.name)
                if _expired(r):
                    r.abandon()
                    gone.append(str(d))
    return gone + purge_moved(machine)


def check_prepare(machine: Machine, agent_id: str | None, name: str | None) -> bool:
    """Refuse at once a receive that would clash; True if the agent lives here already."""
    existing = find_by_id(machine, agent_id) if agent_id else None
    if name is not None and existing is None and machine.settings_file(name).exists():
        other = find(machine, name)
        raise AlreadyExists(
            f"another agent named {name!r} ({other.id}) already lives here",
            hint=f"remove or rename it there first (lnk agent remove {name})",
        )
    return existing is not None


def check_one_filesystem(machine: Machine) -> None:
    """An arriving agent is staged in the receivers' folder and renamed into its place (the
    atomic apply), and its files are linked with the receiver's objects: both need the
    agents' folder on the receivers' filesystem.  Refused before anything is received."""
    agents, receivers = machine.agents_root, machine.receivers_dir
    agents.mkdir(parents=True, exist_ok=True)
    receivers.mkdir(parents=True, exist_ok=True, mode=0o700)
    if os.stat(agents).st_dev != os.stat(receivers).st_dev:
        raise Refused(
            f"{agents} is on another filesystem than {receivers}, where an arriving agent is "
            "staged and renamed into place; nothing was received",
            hint=f"df {agents}/ {machine.state_dir}/ (then put both on one filesystem)",
        )


def prepare(
    machine: Machine,
    agent_id: str | None = None,
    mover_grants: str | None = None,
    model: dict[str, str] | None = None,
) -> Receiver:
    """A fresh receiver: a one-time key pair, and an index of what is held here already.

    ``mover_grants``: the agent's grants as the computer running the move sent them
    (it is the machine the agent leaves), applied at commit as they are; ``model``:
    the model the agent will think with here, decided now (``policy.model_for_arrival``)."""
    rid = RECEIVER_PREFIX + secrets.token_hex(8)
    r = Receiver(machine, rid)
    machine.receivers_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_one_filesystem(machine)
    r.dir.mkdir(mode=0o700)
    key = ReceiverKey.generate()
    fd = os.open(r.dir / "key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.seed)
    r.objects.mkdir()
    r.set_info(created=clock(), agent_id=agent_id, public_key=key.public.text())
    if mover_grants is not None:
        r.set_info(mover_grants=mover_grants)
    if model is not None:
        r.set_info(model=model)
    if agent_id:
        _adopt_earlier_objects(machine, r, agent_id)
        base = _base_for(machine, agent_id)
        if base is not None:
            root, store, cache = base
            r.set_info(base_root=str(root), base_store=store, base_cache=str(cache))
            local_index.index_local(r, root, cache, kept=find_by_id(machine, agent_id) is None)
    return r


def _base_for(machine: Machine, agent_id: str) -> tuple[Path, str, Path] | None:
    """What this machine holds of the agent: its live copy, or, for a move back, the
    folders it left behind (~/Link/Moved/...), whose content then isn't sent again."""
    agent = find_by_id(machine, agent_id)
    if agent is not None:
        return agent.folders.root, agent.settings.store, agent.runtime / "hashes.sqlite"
    try:
        note = json.loads((notes_dir(machine) / f"{agent_id}.json").read_text())
        kept = Path(note["kept"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not kept.is_dir():
        return None
    return kept, detect_driver(kept / "Agent" / "chats"), kept / ".lnk-hashes.sqlite"


def _adopt_earlier_objects(machine: Machine, r: Receiver, agent_id: str) -> None:
    """Content an interrupted receive of the same agent staged is kept, not sent again."""
    for other in machine.receivers_dir.iterdir():
        if other == r.dir or not other.name.startswith(RECEIVER_PREFIX):
            continue
        o = Receiver(machine, other.name)
        if o.info().get("agent_id") != agent_id or (other / "commit.json").exists():
            continue
        if o.objects.is_dir():
            for obj in o.objects.iterdir():
                if len(obj.name) == 64 and not (r.objects / obj.name).exists():
                    os.replace(obj, r.objects / obj.name)
        if o.own_base():  # a bulk it kept as its base: that content, file by file
            for sha, path in o.base_files():
                if not (r.objects / sha).exists():
                    with contextlib.suppress(OSError):
                        os.replace(path, r.objects / sha)
        o.abandon()
