"""``lnk agent restore``: put an agent back from a backup.

The bucket's label is read first, before anything the backup folder holds
(docs/backup.md, "The label"): ``lnk-layout=2`` means the two-folder layout;
no label means the older one, where everything was inside Home/:

    Home/instructions, Home/skills,      ->  Agent/instructions, ... (files)
    Home/memory, Home/schedule
    Home/chats/   (a files-driver store) ->  the agent's collections

Either way the snapshot becomes the records a stream carries, received by
:func:`lnk.payload.receive.receive_records` (every check, one atomic apply).
A big layout-2 snapshot is read by a second process (lnk.backup.restore_reader)
while this one receives: the two halves on two cores.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lnk.agents import registry
from lnk.agents.layout import Machine
from lnk.agents.moved import lives_elsewhere
from lnk.agents.running import is_running
from lnk.agents.settings import check_name, new_agent_id
from lnk.backup import agent_keys, restore_reader
from lnk.backup.agent_repos import open_for_reading, read_layout
from lnk.backup.agent_snapshots import (
    SnapshotParts,
    data_files,
    next_data,
    pick_snapshot,
    read_parts,
    records_layout2,
)
from lnk.backup.reader import Entry, SnapshotReader
from lnk.collections import FileStore
from lnk.errors import AlreadyExists, Refused
from lnk.payload import manifest as M
from lnk.payload import receivers
from lnk.payload.receive import receive_records
from lnk.places.where import agents_on_boxes
from lnk.transport.buckets import Bucket, open_bucket

OLD_AGENT_DIRS = ("instructions", "skills", "memory", "schedule")


@dataclass
class RestoreReport:
    agent: str
    id: str
    owner: str
    snapshot: str
    layout: int
    files: int = 0
    bytes: int = 0
    collections: int = 0
    dropped_grants: list[str] = field(default_factory=list)
    kept_aside: str | None = None
    kept_here: list[dict[str, str]] = field(default_factory=list)  # lnk.agents.policy
    unanswered_boxes: list[str] = field(default_factory=list)  # not asked whether it lives there

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def restore_agent(
    machine: Machine,
    name: str,
    url: str,
    *,
    snapshot: str | None = None,
    force: bool = False,
    as_name: str | None = None,
    bucket: Bucket | None = None,
    progress: Callable[[int], None] | None = None,
) -> RestoreReport:
    """Restore the agent ``name``; with ``as_name``, as a separate agent with a new ID.

    An agent has one copy: a restore of one whose ID lives elsewhere (it moved
    away, this computer moved it to a box, or a box holds it) is refused.
    """
    agent_keys.require_private(agent_keys.load(machine))  # fail before touching the bucket
    from_url = bucket is None
    bucket = bucket or open_bucket(url)
    layout = read_layout(bucket)  # first: before anything the backup folder holds
    repo = open_for_reading(machine, bucket, url)
    info = pick_snapshot(repo, name, snapshot)
    child: restore_reader.ReaderProcess | None = None
    parts: SnapshotParts | None = None
    try:
        if layout == 2 and from_url and info.files >= restore_reader.MIN_FILES:
            # it reads while this one checks; no second process here: read in this one
            with contextlib.suppress(OSError):
                child = restore_reader.ReaderProcess(machine, url, repo.id, info.id)
        if child is not None:
            raw_head = child.head()
        else:
            reader = SnapshotReader(repo, info.id)
            parts = read_parts(reader)
            raw_head = parts.head
        head = M.Head.from_json(raw_head)
        if head.phase != "full":
            raise M.bad(f"the snapshot's manifest is a {head.phase} phase, not a whole agent")
        if head.name != name:
            raise Refused(
                f"snapshot {info.id} holds the agent {head.name!r}, not {name!r}",
                hint=f"lnk agent restore {head.name} --from {url} --snapshot {info.id}",
            )
        unanswered: list[str] = []
        if as_name is not None:
            head = _as_new_agent(raw_head, as_name)
        else:
            unanswered = _refuse_if_elsewhere(machine, head, url)
        receivers.check_one_filesystem(machine)  # before anything of a live copy is moved aside
        kept = _make_room(machine, head, force)
        if child is not None:
            records = child.records(raw_head, progress)
            rep = receive_records(machine, records, stream_id=info.id)
        elif layout == 2:
            assert parts is not None
            records = records_layout2(reader, parts, progress)
            rep = receive_records(machine, records, stream_id=info.id)
        else:
            assert parts is not None
            with tempfile.TemporaryDirectory(prefix="lnk-restore-") as tmp:
                records = records_layout1(reader, parts, Path(tmp), url, progress)
                rep = receive_records(machine, records, store="files", stream_id=info.id)
    finally:
        if parts is not None:
            parts.entries.close()
        if child is not None:
            child.close()
    return RestoreReport(
        rep.agent,
        rep.id,
        rep.owner,
        info.id,
        layout,
        rep.files,
        rep.data_bytes,
        rep.collections,
        rep.dropped_grants,
        str(kept) if kept else None,
        rep.kept_here,
        unanswered,
    )


def _as_new_agent(raw_head: dict[str, Any], as_name: str) -> M.Head:
    """The snapshot's HEAD as a separate agent: a new ID and the name ``as_name``."""
    check_name(as_name)
    raw_head["agent"] = dict(raw_head["agent"], id=new_agent_id(), name=as_name)
    return M.Head.from_json(raw_head)


def _refuse_if_elsewhere(machine: Machine, head: M.Head, url: str) -> list[str]:
    """Refuse to make a second copy of an agent that lives elsewhere; returns the boxes
    that did not answer (so could not say whether it lives there)."""
    if registry.find_by_id(machine, head.agent_id) is not None:
        return []  # it lives here: _make_room decides
    where = lives_elsewhere(machine, head.agent_id)
    unanswered: list[str] = []
    if where is None:
        for b in agents_on_boxes():
            if b.agents is None:
                unanswered.append(b.box)
            elif any(r.id == head.agent_id for r in b.agents):
                where = f"it lives on box {b.box}"
                break
    if where is not None:
        raise AlreadyExists(
            f"{head.name} ({head.agent_id}) is not restored here: {where}, and an agent "
            "has one copy. Bring it here with: lnk agent move --here --agent "
            f"{head.name}",
            hint=f"or restore a separate agent with a new ID: lnk agent restore {head.name} "
            f"--from {url} --as NEWNAME",
        )
    return unanswered


def _make_room(machine: Machine, head: M.Head, force: bool) -> Path | None:
    """Refuse to overwrite an agent unless ``force``; with it, an other agent of that
    name is stopped and removed, its folders kept aside."""

    same_id = registry.find_by_id(machine, head.agent_id)
    same_name = (
        registry.find(machine, head.name) if machine.settings_file(head.name).exists() else None
    )
    there = same_id or same_name
    if there is None:
        if machine.folders(head.name).root.exists() and not force:
            raise AlreadyExists(
                f"{machine.folders(head.name).root} already exists",
                hint="move it aside, or add --force to restore over it",
            )
        return None
    if not force:
        raise AlreadyExists(
            f"the agent {there.name} ({there.id}) already lives here",
            hint="add --force to overwrite it with the backup (its Home files "
            "not in the backup stay)",
        )
    if is_running(there):
        raise Refused(
            f"{there.name} is running here",
            hint=f"stop it first: lnk agent stop --agent {there.name}",
        )
    if same_name is not None and same_name.id != head.agent_id:
        return registry.remove(machine, same_name, keep_files=True)
    return None


# ---- the older layout ---------------------------------------------------------------
def _old_path(p: str) -> str | None:
    """Where an older-layout path goes now; None for Home/chats (collections)."""
    parts = p.split("/")
    if len(parts) >= 2 and parts[0] == "Home":
        if parts[1] == "chats":
            return None
        if parts[1] in OLD_AGENT_DIRS:
            return "/".join(["Agent", *parts[1:]])
    return p


def records_layout1(
    reader: SnapshotReader,
    parts: SnapshotParts,
    tmp: Path,
    url: str,
    progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """An older-layout snapshot as records of the two-folder layout."""
    if parts.collections or parts.others:
        raise Refused(
            f"{url} carries no lnk-layout label, yet snapshot {reader.info.id} is "
            "laid out as two folders",
            hint=f"if lnk made these backups, label the "
            f"bucket with your account (lnk bucket label {url}), then restore again",
        )
    yield M.HEAD, M.dump(parts.head)
    files = data_files(reader)
    chats = tmp / "chats"
    chats.mkdir()
    diverted: dict[int, Path] = {}  # hard-link group -> its bytes under chats/
    carried: set[int] = set()
    count = {"entries": 0, "files": 0, "data_bytes": 0}
    batch: list[M.FileEntry] = []
    sources: list[tuple[M.FileEntry, Any]] = []

    def flush() -> Iterator[tuple[int, bytes]]:
        yield M.FILES, M.dump([e.to_json() for e in batch])
        for _e, src in sources:
            if isinstance(src, Path):
                with open(src, "rb") as f:
                    while chunk := f.read(1 << 20):
                        count["data_bytes"] += len(chunk)
                        yield M.DATA, chunk
                continue
            for chunk in reader.open(src):
                count["data_bytes"] += len(chunk)
                if progress:
                    progress(len(chunk))
                yield M.DATA, chunk
        batch.clear()
        sources.clear()

    outside: dict[int, Any] = {}  # hard-link group -> the snapshot entry holding its bytes
    for line in parts.entries:
        raw = M.load_json(line, "file list")
        e = M.FileEntry.from_json(raw)
        if not (e.path == "Home" or e.path.startswith("Home/")):
            raise Refused(
                f"{url} carries no lnk-layout label, yet snapshot {reader.info.id} "
                f"holds {e.path!r} outside Home",
                hint=f"if lnk made these backups, label the bucket with your account "
                f"(lnk bucket label {url}), then restore again",
            )
        new = _old_path(e.path)
        if new is None:
            _divert(e, chats, files, diverted, outside, reader)
            continue
        data_src: Any = None
        if e.data:
            data_src = next_data(files, e.path)
        elif e.group is not None and e.group in diverted and e.group not in carried:
            data_src = diverted[e.group]
        if e.group is not None:
            carried.add(e.group)
            if isinstance(data_src, Entry):
                outside.setdefault(e.group, data_src)
        e = M.FileEntry(
            new,
            e.kind,
            e.mode,
            e.size,
            e.sha256,
            e.group,
            data_src is not None and e.size > 0,
            e.mtime_ns,
        )
        count["entries"] += 1
        count["files"] += e.kind == "f"
        batch.append(e)
        if e.data:
            sources.append((e, data_src))
        if len(batch) >= M.FILES_PER_RECORD:
            yield from flush()
    if batch:
        yield from flush()
    colls, recs = 0, 0
    store = FileStore(chats, fsync=False)
    try:
        for cid in store.collections():
            colls += 1
            buf = bytearray()
            for rec in store.export(cid):
                recs += 1
                buf += json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
                if len(buf) >= 1 << 20:
                    yield M.COLLECTION, bytes(buf)
                    buf.clear()
            if buf:
                yield M.COLLECTION, bytes(buf)
    finally:
        store.close()
    yield M.SUMMARY, M.dump(count | {"collections": colls, "records": recs})
    shutil.rmtree(chats, ignore_errors=True)


def _divert(
    e: M.FileEntry,
    chats: Path,
    files: Iterator[Any],
    diverted: dict[int, Path],
    outside: dict[int, Any],
    reader: SnapshotReader,
) -> None:
    """Write a Home/chats entry into the temporary store tree."""
    rel = e.path.split("/", 2)[2] if e.path.count("/") >= 2 else ""
    target = chats / rel if rel else chats
    if e.kind == "d":
        target.mkdir(parents=True, exist_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if e.data:
        with open(target, "wb") as f:
            for chunk in reader.open(next_data(files, e.path)):
                f.write(chunk)
        if e.group is not None:
            diverted.setdefault(e.group, target)
    elif e.group is not None and e.group in diverted:
        shutil.copyfile(diverted[e.group], target)
    elif e.group is not None and e.group in outside:
        with open(target, "wb") as f:
            for chunk in reader.open(outside[e.group]):
                f.write(chunk)
    else:
        target.touch()
