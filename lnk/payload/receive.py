"""Receiving an agent: stage and verify the whole stream, then apply it at once.

A receive that fails for any reason leaves the destination exactly as it was:
nothing outside the receiver's own folder is written until the final record
has verified and the summary matches.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from lnk import protocol
from lnk.agents import policy, ports
from lnk.agents.layout import Machine
from lnk.agents.machine import account_owner
from lnk.agents.registry import Agent, find_by_id, taken_blocks
from lnk.agents.running import is_running
from lnk.agents.settings import ModelSettings, Settings, migrate, write_toml_atomic
from lnk.errors import AlreadyExists, LnkError, Refused, StreamError, TransportError
from lnk.formats.reader import StreamReader
from lnk.payload import commit, kept, safefs
from lnk.payload import manifest as M
from lnk.payload.bulk_base import keep_as_base
from lnk.payload.placed import remember_placed
from lnk.payload.receivers import Receiver, open_receiver, prepare
from lnk.payload.snapshots import copy_database
from lnk.payload.staging import Stage, disk_full
from lnk.payload.walk import SQLITE_SIDECARS


@dataclass
class ReceiveReport:
    agent: str
    id: str
    owner: str
    phase: str
    committed: bool
    entries: int = 0
    files: int = 0
    data_bytes: int = 0
    collections: int = 0
    unchanged_home_files: int = 0
    dropped_grants: list[str] = field(default_factory=list)
    kept_here: list[dict[str, str]] = field(default_factory=list)
    grants_from: str = ""
    skipped: list[str] = field(default_factory=list)
    stream_id: str = ""
    # a move back: files a person added or changed in the kept folder, kept; and those
    # changed both there and in the agent, kept beside it ({"path", "kept_as"})
    kept_from_moved: list[str] = field(default_factory=list)
    conflicts: list[dict[str, str]] = field(default_factory=list)

    def answer(self) -> protocol.ReceiveReport:
        """The report as the box protocol carries it."""
        return protocol.ReceiveReport(
            agent=self.agent,
            id=self.id,
            owner=self.owner,
            phase=self.phase,
            committed=self.committed,
            entries=self.entries,
            files=self.files,
            data_bytes=self.data_bytes,
            collections=self.collections,
            unchanged_home_files=self.unchanged_home_files,
            dropped_grants=tuple(self.dropped_grants),
            kept_here=tuple(self.kept_here),
            grants_from=self.grants_from,
            skipped=tuple(self.skipped),
            stream_id=self.stream_id,
            kept_from_moved=tuple(self.kept_from_moved),
            conflicts=tuple(self.conflicts),
        )

    def to_json(self) -> dict[str, Any]:
        return self.answer().to_json()


def check_destination(machine: Machine, head: M.Head) -> Agent | None:
    """Refuse a stream that would clash with what lives here; returns the agent it replaces."""
    existing = find_by_id(machine, head.agent_id)
    settings_file = machine.settings_file(head.name)
    if existing is None and (settings_file.exists() or machine.folders(head.name).root.exists()):
        raise AlreadyExists(
            f"an agent named {head.name!r} already lives here, and it is another agent than the "
            f"one in the stream ({head.agent_id})",
            hint=f"remove or rename it first (lnk agent remove {head.name}), then send again",
        )
    if existing is not None and existing.name != head.name:
        raise AlreadyExists(
            f"the agent {head.agent_id} lives here as {existing.name!r}, the stream names it "
            f"{head.name!r}",
            hint="rename one of them so both ends agree",
        )
    if head.owner.startswith("acct-") and account_owner(machine) != head.owner:
        raise Refused(
            f"the agent belongs to the account {head.owner}, and this machine is not "
            "signed in as it",
            hint="sign in here as that account first",
        )
    if existing is not None and is_running(existing):
        raise Refused(f"{existing.name} is running here", hint="stop it here first, or move it")
    return existing


def _settings_here(
    head: M.Head,
    existing: Agent | None,
    machine: Machine,
    store: str,
    mover_grants: str | None,
    model: ModelSettings | None,
    told: bool,
) -> policy.Arrival:
    """The receiving machine decides, the stream informs (lnk.agents.policy)."""
    try:
        data, _ = migrate(dict(head.settings))
        data["id"], data["name"], data["owner"] = head.agent_id, head.name, head.owner
        data["store"] = store
        s = Settings.from_toml(data, "the stream's settings")
    except LnkError as e:
        raise M.bad(e.message) from e
    # the cutover: every commit here raises the epoch, so a bridge of the copy before acts
    # no more (lnk.connections.fence)
    s.epoch = max(s.epoch, existing.settings.epoch if existing is not None else 0) + 1
    if existing is not None:
        s.port_base, s.port_count = existing.settings.port_base, existing.settings.port_count
    else:
        s.port_base = ports.allocate(s.name, s.harness, taken_blocks(machine))
    here = existing.settings if existing is not None else None
    try:
        return policy.arrive(machine, s, head.grants, here, mover_grants, model, told)
    except RecursionError:
        raise M.bad("the stream's grants are nested too deeply") from None


def receive(
    machine: Machine,
    receiver: Receiver | str,
    inp: BinaryIO,
    *,
    store: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReceiveReport:
    """Apply the sealed stream ``inp`` through ``receiver`` (opened by the caller once,
    or named by its ID)."""
    commit.finish_pending(machine)
    r = receiver if isinstance(receiver, Receiver) else open_receiver(machine, receiver)
    reader = StreamReader(inp, r.key())
    return _receive(machine, r, reader, lambda: reader.stream_id.hex(), store, progress)


def receive_records(
    machine: Machine,
    records: Iterable[tuple[int, bytes]],
    *,
    store: str | None = None,
    progress: Callable[[int], None] | None = None,
    stream_id: str = "",
) -> ReceiveReport:
    """Receive a payload given as records (HEAD, FILES, DATA, COLLECTION, SUMMARY) rather
    than a sealed stream (a restore from a backup): the same checks, the same atomic apply.

    A snapshot carries the bytes of every file that has any (a hard link's by its group's
    first), so no later entry looks for content in the receiver's objects: nothing is
    linked there (an entry that did would be refused as holding content held nowhere)."""
    commit.finish_pending(machine)
    r = prepare(machine)
    try:
        return _receive(machine, r, records, lambda: stream_id, store, progress, keep_objects=False)
    finally:
        if not (r.dir / commit.JOURNAL).exists():
            r.abandon()


def _receive(
    machine: Machine,
    r: Receiver,
    records: Iterable[tuple[int, bytes]],
    stream_id: Callable[[], str],
    store: str | None,
    progress: Callable[[int], None] | None,
    *,
    keep_objects: bool = True,
) -> ReceiveReport:
    stage = Stage(r, store, keep_objects)
    existing: Agent | None = None
    try:
        for rtype, body in records:
            had_head = stage.head is not None
            stage.take(rtype, body)
            if not had_head and stage.head is not None:
                existing = check_destination(machine, stage.head)
                if existing is not None and stage.store_driver is None:
                    stage.store_driver = existing.settings.store
                _check_phase(r, stage.head)
                if stage.head.phase != "bulk":
                    stage.look_at_base()
            if progress and rtype == M.DATA:
                progress(len(body))
        stage.finish()
        head = stage.head
        assert head is not None
        report = ReceiveReport(
            head.name,
            head.agent_id,
            head.owner,
            head.phase,
            False,
            stage.entries,
            stage.files,
            stage.data_bytes,
            stage.collections,
            stream_id=stream_id(),
        )
        if head.phase == "bulk":
            _keep_bulk(machine, r, stage, stream_id(), keep_objects)
            return report
        return _commit(machine, r, stage, head, existing, report)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise disk_full(e) from e
        raise
    except sqlite3.OperationalError as e:  # SQLite says "database or disk is full"
        if "full" in str(e):
            raise disk_full(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from e
        raise
    except safefs.Conflict as e:
        raise Refused(
            f"the stream's files clash with what is here: {e}",
            hint="move the thing in the way aside, then send again",
        ) from e
    finally:
        # never hide the error already on its way (a full disk fails the close too)
        with contextlib.suppress(OSError, sqlite3.Error):
            stage.close()
        stage.db.close()
        if not (r.dir / commit.JOURNAL).exists():
            safefs.rmtree(stage.work)


def _check_phase(r: Any, head: M.Head) -> None:
    expected = r.info().get("agent_id")
    if expected and expected != head.agent_id:  # its inventory indexes another agent's files
        raise M.bad(
            f"this receiver was prepared for the agent {expected}, the stream carries "
            f"{head.agent_id}"
        )
    if head.phase != "final":
        return
    held = r.info().get("bulk_stream")
    if not held or head.base_stream != held:
        raise StreamError(
            f"this final phase builds on stream {head.base_stream or '(none named)'}, but this "
            "receiver holds "
            f"{held or 'no bulk phase'}",
            hint="send the bulk phase to this receiver first",
        )


def _keep_bulk(machine: Machine, r: Any, stage: Stage, stream_id: str, keep_objects: bool) -> None:
    safefs.rmtree(r.bulk)
    (r.bulk / "agent").mkdir(parents=True)
    chats = stage.work / "agent" / "chats"
    if chats.exists():
        chats.rename(r.bulk / "agent" / "chats")
    if keep_objects and not r.info().get("base_root"):  # a first move: the bulk is the base
        keep_as_base(machine, r, stage)
    r.set_info(bulk_stream=stream_id)
    # what the bulk staged reaches the disk now, while the agent still answers: the
    # final's one sync before its journal then waits only for what the final wrote
    commit.sync_staged(r)


def _commit(
    machine: Machine,
    r: Any,
    stage: Stage,
    head: M.Head,
    existing: Agent | None,
    report: ReceiveReport,
) -> ReceiveReport:
    agent_root = machine.folders(head.name).root
    report.unchanged_home_files, adopt = commit.materialize(stage, r, agent_root)
    kept_base = _kept_base(r, agent_root)
    if kept_base is not None:  # a move back: what a person did in the kept folder stays
        report.kept_from_moved, report.conflicts, whole = kept.merge(
            r.index_db(),
            stage.db,
            Path(kept_base),
            stage.staged,
            {p for p, _ in stage.held_folders()},
        )
        if not whole:
            kept_base = None
    mover_grants = r.info().get("mover_grants")  # what the computer running the move sent
    mover_grants = mover_grants if isinstance(mover_grants, str) else None
    decided = r.info().get("model")  # the model decided at the prepare, if one was
    model = policy.model_settings(decided) if isinstance(decided, dict) else None
    told = isinstance(decided, dict) and decided.get("told") is True
    arrival = _settings_here(
        head, existing, machine, stage.store_driver or "files", mover_grants, model, told
    )
    work = stage.work
    write_toml_atomic(work / "settings.toml", arrival.settings.to_toml())
    if arrival.grants is not None:
        (work / "sandbox.toml").write_text(arrival.grants)
    report.dropped_grants, report.kept_here = arrival.dropped, arrival.kept_here
    report.grants_from = arrival.grants_from
    try:
        commit.decide(
            r,
            {
                "name": head.name,
                "id": head.agent_id,
                "agent_root": str(agent_root),
                "settings_file": str(machine.settings_file(head.name)),
                "moved_note": str(machine.state_dir / "moved" / f"{head.agent_id}.json"),
                # a move's final: the agent's connections wait until the copy where it was
                # is gone (the move's moved-in step), so an undone move answers nothing twice
                "hold": str(machine.hold_file(head.agent_id)) if head.phase == "final" else None,
                "drop_kept": kept_base,
                "adopt": adopt,
            },
        )
    except OSError as e:
        raise TransportError(
            f"could not write the commit journal: {e}",
            hint="nothing was applied; free space and try again",
        ) from e
    stage.close()
    _adopt_hashes(r, machine.runtime_dir(head.agent_id) / "hashes.sqlite", agent_root)
    report.skipped = commit.apply(
        r,
        before_cleanup=lambda skipped: remember_placed(
            stage, machine.runtime_dir(head.agent_id) / "hashes.sqlite", agent_root, skipped
        ),
    )["skipped"]
    policy.forget(machine, head.agent_id)
    report.committed = True
    return report


def _adopt_hashes(r: Any, cache_path: Path, agent_root: Path) -> None:
    """A move back to the folders the agent left here: the agent does not live here,
    so its hash cache starts as theirs, whole (what came back with them keeps its stat,
    and a row of anything else is checked by stat, so it never misleads)."""
    info = r.info()
    base, other = info.get("base_root"), info.get("base_cache")
    if base and other and Path(base) != agent_root:
        with contextlib.suppress(Exception):  # a cache: losing it costs time only
            _take_cache(Path(other), cache_path)


def _take_cache(src: Path, dst: Path) -> None:
    """The kept folder's cache becomes the agent's: renamed into place (the kept folder
    goes at this very commit; a copy cost the pause 0.06 s at 100,000 files), copied
    through SQLite where a log or a journal was left beside it, or across file systems;
    the kept folder's own notes dropped."""
    dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for side in SQLITE_SIDECARS:  # (another file's log or journal would be read as its own)
        Path(f"{dst}{side}").unlink(missing_ok=True)
    # (a copy read-write: a journal left beside it is rolled back first)
    if any(Path(f"{src}{side}").exists() for side in ("-wal", "-journal")):
        copy_database(src, dst, read_only=False)
    else:
        try:
            os.replace(src, dst)
        except OSError:  # another file system
            copy_database(src, dst, read_only=False)
    b = sqlite3.connect(dst)
    try:
        kept.drop_notes(b)  # the kept folder's own notes
        b.commit()
    finally:
        b.close()


def _kept_base(r: Any, agent_root: Path) -> str | None:
    """The folders the agent left here when it moved away, if the receive built on them."""
    base = r.info().get("base_root")
    if not base or Path(base) == agent_root:
        return None
    return str(base) if (Path(base) / "Agent").is_dir() else None
